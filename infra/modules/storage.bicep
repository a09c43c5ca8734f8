// One storage account for the Functions host (AzureWebJobsStorage), the deployment package
// and the app (orders table and its in-flight table, the Python agents' tables; Storage Queues
// when the storage transport is selected).
// Shared keys are off: every client, the host included, uses Entra ID.
// With restrictNetwork (main.bicep networkIsolation) public network access is off: the app
// comes in through private endpoints (network.bicep), other clients only from allowedIpAddresses.

param name string
param location string
param tags object = {}
param tableName string
@description('The in-flight table beside the orders table: the Supervisor\'s index, kept apart so its query never passes finished history.')
param liveTableName string
@description('Tables the Python agents keep their records in (PythonAgent.tables).')
param appTableNames array = []
param deploymentContainerName string
@description('Queues of the storage transport; a "<name>-poison" queue is added for each (the Functions host moves a message there after maxDequeueCount failures). Empty for the Service Bus transport.')
param queueNames array = []
@description('Network isolation: deny public network access; the app reaches the account through private endpoints (network.bicep).')
param restrictNetwork bool = false
@description('With restrictNetwork: public IPv4 addresses or CIDR ranges still let in (the operator CLI); empty: public network access disabled.')
param allowedIpAddresses array = []

var poisonQueueNames = map(queueNames, queue => '${queue}-poison')
var allQueueNames = concat(queueNames, poisonQueueNames)
// Storage IP rules take a single address without a prefix length (no /31 or /32 ranges).
var ipRules = map(allowedIpAddresses, ip => {
  value: replace(ip, '/32', '')
  action: 'Allow'
})
var publicNetworkAccess = (restrictNetwork && empty(allowedIpAddresses)) ? 'Disabled' : 'Enabled'
var networkAcls = restrictNetwork ? {
  bypass: 'AzureServices'
  defaultAction: 'Deny'
  ipRules: ipRules
  virtualNetworkRules: []
} : {
  bypass: 'AzureServices'
  defaultAction: 'Allow'
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
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
    publicNetworkAccess: publicNetworkAccess
    dnsEndpointType: 'Standard'
    networkAcls: networkAcls
  }
}

resource blobServices 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobServices
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource tableServices 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource ordersTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableServices
  name: tableName
}

resource liveTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableServices
  name: liveTableName
}

resource appTables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for appTableName in appTableNames: {
  parent: tableServices
  name: appTableName
}]

resource queueServices 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for queueName in allQueueNames: {
  parent: queueServices
  name: queueName
}]

output name string = storage.name
output id string = storage.id
output blobEndpoint string = storage.properties.primaryEndpoints.blob
output queueEndpoint string = storage.properties.primaryEndpoints.queue
output tableEndpoint string = storage.properties.primaryEndpoints.table
output deploymentContainerUrl string = '${storage.properties.primaryEndpoints.blob}${deploymentContainer.name}'
output tableName string = ordersTable.name
