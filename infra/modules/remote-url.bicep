// One HTTP agent's remote-service URL as the app gets it (SAS_REMOTE_<AGENT>_URL): given, or
// the simulator's when it is deployed. A deployment with neither stops here, naming the agent.

@description('The remote service\'s base URL: SAS_REMOTE_<AGENT>_URL, or the simulator\'s (SAS_DEPLOY_SIMULATOR=true).')
@minLength(8)
param url string

output url string = url
