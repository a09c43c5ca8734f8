// Service Bus (Standard) for the servicebus transport: local (SAS key) auth disabled, TLS 1.2,
// one queue per role with dead-lettering, duplicate detection and a lock that outlasts the
// longest step complete-by budget. See infra/README.md for how these relate.

param name string
param location string
param tags object = {}
param queueNames array
@description('Peek-lock duration (ISO 8601), >= the longest complete-by budget, at most PT5M.')
param lockDuration string = 'PT1M'
@description('Duplicate detection window (ISO 8601, PT20S to P7D).')
param duplicateDetectionHistoryTimeWindow string = 'PT10M'
@minValue(1)
param maxDeliveryCount int = 5
param defaultMessageTimeToLive string = 'P14D'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource queues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [for queueName in queueNames: {
  parent: namespace
  name: queueName
  properties: {
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionHistoryTimeWindow
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: defaultMessageTimeToLive
    requiresSession: false
    enablePartitioning: false
    enableBatchedOperations: true
  }
}]

output name string = namespace.name
output id string = namespace.id
// serviceBusEndpoint is 'https://<name>.servicebus.windows.net:443/' (cloud-specific suffix).
output fullyQualifiedNamespace string = split(split(replace(namespace.properties.serviceBusEndpoint, 'https://', ''), ':')[0], '/')[0]
