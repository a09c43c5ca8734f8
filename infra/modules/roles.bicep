// Data-plane role assignments for one principal: data roles only, each scoped to the one
// resource that needs it (a Service Bus receive-side role: to each trigger queue, never the
// namespace). No Owner, Contributor, User Access Administrator or any other control-plane
// role (tests/unit/test_infra_consistency.py checks the role ids and their scopes).
// Assignment names are deterministic guid(scope, principal, role): re-deploying is a no-op.

param principalId string
@allowed([
  'ServicePrincipal'
  'User'
  'Group'
])
param principalType string = 'ServicePrincipal'
param storageAccountName string
@description('Grant Storage Queue Data Contributor: the storage transport only.')
param storageQueues bool = false
@description('Service Bus namespace; empty for the storage transport (no Service Bus roles).')
param serviceBusNamespaceName string = ''
@description('Service Bus queues the app consumes (its triggers): the receive-side role is scoped to each of them.')
param triggerQueueNames array = []
@description('Service Bus queues the principal reads but no trigger consumes (the alerts queue: the queue-depth gauges peek it, operators receive from it): Data Receiver on each.')
param readQueueNames array = []
param applicationInsightsName string
@description('Also grant the roles only the Functions host and its scale controller need: blob data, telemetry, and Data Owner (instead of Receiver) on the trigger queues.')
param hostRoles bool = true

// Built-in role definition ids (the same in every tenant).
var storageBlobDataOwner = {
  id: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  name: 'Storage Blob Data Owner'
}
var storageQueueDataContributor = {
  id: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  name: 'Storage Queue Data Contributor'
}
var storageTableDataContributor = {
  id: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  name: 'Storage Table Data Contributor'
}
var serviceBusDataSender = {
  id: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  name: 'Azure Service Bus Data Sender'
}
var serviceBusDataReceiver = {
  id: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  name: 'Azure Service Bus Data Receiver'
}
var serviceBusDataOwner = {
  id: '090c5cfd-751d-490a-894a-3ce6f1109419'
  name: 'Azure Service Bus Data Owner'
}
var monitoringMetricsPublisher = {
  id: '3913510d-42f4-4e42-8a64-420c390055eb'
  name: 'Monitoring Metrics Publisher'
}

// Storage Blob Data Owner: the Functions host's own storage (AzureWebJobsStorage) with an
// identity needs it (host keys, timer and singleton blob leases, its containers) and the Flex
// Consumption deployment package is read from a blob container with the same identity; the
// Functions documentation lists Owner, not Contributor, for identity-based host storage.
// Table: the orders table. Queue (storage transport only): its queues and their -poison
// queues (the host writes those), and reply-to queues of submitters.
var hostStorageRoles = hostRoles ? [
  storageBlobDataOwner
] : []
var queueStorageRoles = storageQueues ? [
  storageQueueDataContributor
] : []
var storageRoles = concat(hostStorageRoles, [
  storageTableDataContributor
], queueStorageRoles)
// Send, on the namespace: the app sends to its own queues and to the submitters' reply-to
// (status) queues, whose names come with each order, so no narrower scope covers them.
var serviceBusRoles = empty(serviceBusNamespaceName) ? [] : [
  serviceBusDataSender
]
// Receive, on each trigger queue only. The app's identity gets Data Owner there: the scale
// controller reads queue length with it for target-based scaling, which needs Manage rights
// (Data Owner includes receive). Anyone else gets Receiver. Neither is granted on the namespace.
var triggerQueueRole = hostRoles ? serviceBusDataOwner : serviceBusDataReceiver
var serviceBusTriggerQueues = empty(serviceBusNamespaceName) ? [] : triggerQueueNames
var triggerQueueRoles = empty(serviceBusTriggerQueues) ? [] : [
  triggerQueueRole
]
var serviceBusReadQueues = empty(serviceBusNamespaceName) ? [] : readQueueNames
var readQueueRoles = empty(serviceBusReadQueues) ? [] : [
  serviceBusDataReceiver
]
// Entra-authenticated telemetry into Application Insights (local auth is disabled there).
var monitoringRoles = hostRoles ? [
  monitoringMetricsPublisher
] : []

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource triggerQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for queueName in serviceBusTriggerQueues: {
  parent: serviceBus
  name: queueName
}]

resource readQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for queueName in serviceBusReadQueues: {
  parent: serviceBus
  name: queueName
}]

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource storageAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in storageRoles: {
  name: guid(storage.id, principalId, role.id)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role.id)
    principalId: principalId
    principalType: principalType
    description: '${role.name} for sas'
  }
}]

resource serviceBusAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in serviceBusRoles: {
  name: guid(serviceBus.id, principalId, role.id)
  scope: serviceBus
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role.id)
    principalId: principalId
    principalType: principalType
    description: '${role.name} for sas'
  }
}]

resource triggerQueueAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (queueName, i) in serviceBusTriggerQueues: {
  name: guid(triggerQueues[i].id, principalId, triggerQueueRole.id)
  scope: triggerQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', triggerQueueRole.id)
    principalId: principalId
    principalType: principalType
    description: '${triggerQueueRole.name} on queue ${queueName} for sas'
  }
}]

resource readQueueAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (queueName, i) in serviceBusReadQueues: {
  name: guid(readQueues[i].id, principalId, serviceBusDataReceiver.id)
  scope: readQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver.id)
    principalId: principalId
    principalType: principalType
    description: '${serviceBusDataReceiver.name} on queue ${queueName} for sas'
  }
}]

resource monitoringAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in monitoringRoles: {
  name: guid(applicationInsights.id, principalId, role.id)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role.id)
    principalId: principalId
    principalType: principalType
    description: '${role.name} for sas'
  }
}]

output roleNames array = map(concat(storageRoles, serviceBusRoles, triggerQueueRoles, readQueueRoles, monitoringRoles), role => role.name)
