// Diagnostic settings: the function app, the Service Bus namespace (servicebus transport) and
// the storage account (account metrics; blob, queue and table service logs and metrics) send
// their logs and metrics to the Log Analytics workspace. The storage transport's alert rules
// (alerts.bicep) query StorageQueueLogs' PutMessage rows, which StorageWrite fills.
// Storage logs are a row per request: every lease renewal, every order's table transactions
// and queue reads. By default ('essential') blob and table log only deletions and the queues
// only writes; 'all' logs every request of every service.

param logAnalyticsId string
param functionAppName string
param storageAccountName string
@description('Service Bus namespace; empty for the storage transport (no setting for it).')
param serviceBusNamespaceName string = ''
@description('Storage request logs: essential (blob and table deletions, queue writes) or all.')
@allowed([
  'essential'
  'all'
])
param storageLogs string = 'essential'

var settingName = 'to-log-analytics'
var allLogs = [
  {
    categoryGroup: 'allLogs'
    enabled: true
  }
]
var allMetrics = [
  {
    category: 'AllMetrics'
    enabled: true
  }
]
var storageDeletes = [
  {
    category: 'StorageDelete'
    enabled: true
  }
]
var storageWrites = [
  {
    category: 'StorageWrite'
    enabled: true
  }
]
var blobAndTableLogs = (storageLogs == 'all') ? allLogs : storageDeletes
var queueLogs = (storageLogs == 'all') ? allLogs : storageWrites
// Storage accounts and their services publish the 'Transaction' metric category.
var storageMetrics = [
  {
    category: 'Transaction'
    enabled: true
  }
]

resource functionApp 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobServices 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource queueServices 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource tableServices 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource functionAppDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: functionApp
  properties: {
    workspaceId: logAnalyticsId
    logs: allLogs
    metrics: allMetrics
  }
}

resource serviceBusDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(serviceBusNamespaceName)) {
  name: settingName
  scope: serviceBus
  properties: {
    workspaceId: logAnalyticsId
    logs: allLogs
    metrics: allMetrics
  }
}

// The account itself has metrics only; logs are per service.
resource storageDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: storage
  properties: {
    workspaceId: logAnalyticsId
    metrics: storageMetrics
  }
}

resource blobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: blobServices
  properties: {
    workspaceId: logAnalyticsId
    logs: blobAndTableLogs
    metrics: storageMetrics
  }
}

resource queueDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: queueServices
  properties: {
    workspaceId: logAnalyticsId
    logs: queueLogs
    metrics: storageMetrics
  }
}

resource tableDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: settingName
  scope: tableServices
  properties: {
    workspaceId: logAnalyticsId
    logs: blobAndTableLogs
    metrics: storageMetrics
  }
}
