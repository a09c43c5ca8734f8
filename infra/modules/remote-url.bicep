// Where one HTTP agent's remote-service URL (SAS_REMOTE_<AGENT>_URL) comes from: the parameter,
// or the simulator when that is empty and the simulator is deployed. With neither, the
// deployment fails here; the app's settings read the output, so the app is not created or
// changed before the check passes.

@description('parameter: SAS_REMOTE_<AGENT>_URL; simulator: SAS_DEPLOY_SIMULATOR=true with the URL left empty. Neither: set one of them.')
@allowed([
  'parameter'
  'simulator'
])
param source string

output source string = source
