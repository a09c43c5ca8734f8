// The remote-service simulator as a function app of its own (deploySimulator), for a demo:
// a stranger to sas, as a real provider is. It has its own identity and storage account (its
// Functions host's storage and deployment package) and no right on sas's data; it writes its
// telemetry to sas's Application Insights. One instance: its ledger is in memory. Anonymous
// HTTP: anyone who knows the URL can call it.

param location string
param tags object = {}
@description('The suffix of its resources\' names (main.bicep\'s resourceToken).')
param resourceToken string
param applicationInsightsName string
@description('Its faults, fixed at start: a FaultConfig (sas_local/simulator/faults.py); empty: none.')
param faults object = {}

var appName = 'func-sim-${resourceToken}'

module identity 'identity.bicep' = {
  name: 'simulator-identity'
  params: {
    name: 'id-sim-${resourceToken}'
    location: location
    tags: tags
  }
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: 'stsim${resourceToken}'
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
  }
}

resource blobServices 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobServices
  name: 'app-package-${take(appName, 32)}'
  properties: {
    publicAccess: 'None'
  }
}

// The host's roles on its own account and telemetry (roles.bicep, with no queue or namespace).
module roles 'roles.bicep' = {
  name: 'simulator-roles'
  params: {
    principalId: identity.outputs.principalId
    principalType: 'ServicePrincipal'
    storageAccountName: storage.name
    applicationInsightsName: applicationInsightsName
    hostRoles: true
  }
}

module functionApp 'functionapp.bicep' = {
  name: 'simulator-functionapp'
  params: {
    name: appName
    planName: 'plan-sim-${resourceToken}'
    location: location
    tags: tags
    serviceName: 'simulator'
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageAccountName: storage.name
    deploymentContainerName: deploymentContainer.name
    applicationInsightsName: applicationInsightsName
    appSettings: {
      SAS_SIMULATOR_FAULTS: empty(faults) ? '' : string(faults)
    }
    maximumInstanceCount: 1
    instanceMemoryMB: 2048
    // Its handlers are async on one event loop: one instance serves many calls at once.
    httpPerInstanceConcurrency: 100
  }
  dependsOn: [
    roles
  ]
}

output name string = functionApp.outputs.name
output uri string = functionApp.outputs.uri
