// Where one HTTP agent's remote-service URL (SAS_REMOTE_<AGENT>_URL) comes from: the parameter,
// or the simulator when that is empty and the simulator is deployed. Computed from parameters
// alone, so ARM can refuse a deployment with neither when it validates, before it creates
// anything; the app's settings read the output, so the app waits for the check.

@description('parameter: SAS_REMOTE_<AGENT>_URL; simulator: SAS_DEPLOY_SIMULATOR=true with the URL left empty. Neither: set one of them.')
@allowed([
  'parameter'
  'simulator'
])
param source string

output source string = source
