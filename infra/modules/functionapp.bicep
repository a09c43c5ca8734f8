// Flex Consumption (FC1) plan + Python 3.11 function app running as the user-assigned
// identity: deployment package, host storage, app connections and telemetry all use it.
// Flex Consumption takes runtime and scale from functionAppConfig: FUNCTIONS_WORKER_RUNTIME,
// FUNCTIONS_EXTENSION_VERSION and WEBSITE_RUN_FROM_PACKAGE are not app settings here.

param name string
param planName string
param location string
param tags object = {}
@description('azd service name (azure.yaml) this app hosts.')
param serviceName string = 'api'
param identityId string
param identityClientId string
param storageAccountName string
param deploymentContainerName string
param applicationInsightsName string
@description('App settings of sas (SAS_* and the SasStorage / SasServiceBus connections).')
param appSettings object
@description('Maximum instances of each of its scaling groups (each queue function; the HTTP functions together). The platform takes 1 to 1000.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 100
@allowed([
  2048
  4096
])
param instanceMemoryMB int = 2048
@description('Requests one instance serves at once (its HTTP functions); 0: the platform\'s default.')
@minValue(0)
@maxValue(1000)
param httpPerInstanceConcurrency int = 0
@description('Network isolation: the subnet (delegated to Microsoft.App/environments) the app\'s outbound traffic goes through, to the private endpoints of its storage and Service Bus; empty: no VNet integration.')
param virtualNetworkSubnetId string = ''

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

// The host's own storage and telemetry, identity-based.
var hostSettings = {
  AzureWebJobsStorage__blobServiceUri: storage.properties.primaryEndpoints.blob
  AzureWebJobsStorage__queueServiceUri: storage.properties.primaryEndpoints.queue
  AzureWebJobsStorage__tableServiceUri: storage.properties.primaryEndpoints.table
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  APPLICATIONINSIGHTS_CONNECTION_STRING: applicationInsights.properties.ConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  tags: union(tags, {
    'azd-service-name': serviceName
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // Outbound only: the app's HTTP endpoint stays public (function keys). Calls to public
    // addresses (the remote services, Application Insights) still reach the internet, from the
    // platform's outbound addresses (there is no NAT gateway).
    virtualNetworkSubnetId: empty(virtualNetworkSubnetId) ? null : virtualNetworkSubnetId
    siteConfig: {
      minTlsVersion: '1.2'
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
        triggers: httpPerInstanceConcurrency == 0 ? null : {
          http: {
            perInstanceConcurrency: httpPerInstanceConcurrency
          }
        }
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

// No basic-auth (user name and password) publishing: FTP and the SCM (Kudu) endpoint accept
// Entra ID only. azd deploys to Flex Consumption with an Entra token, so nothing needs them.
resource ftpPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'scm'
  properties: {
    allow: false
  }
}

resource functionAppSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: functionApp
  name: 'appsettings'
  properties: union(appSettings, hostSettings)
}

output name string = functionApp.name
output id string = functionApp.id
output uri string = 'https://${functionApp.properties.defaultHostName}'
