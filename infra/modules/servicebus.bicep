// Service Bus for the servicebus transport (Standard by default, or Premium): local (SAS key)
// auth disabled, TLS 1.2, one queue per role with dead-lettering, duplicate detection and a lock
// that outlasts the longest step complete-by budget. See infra/README.md for how these relate.
// With restrictNetwork (main.bicep networkIsolation, Premium only: Standard has no private
// endpoints) public network access is off: the app comes in through a private endpoint
// (network.bicep), other clients only from allowedIpAddresses.

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
@description('Standard, or Premium: dedicated messaging units billed by the hour, and private endpoints.')
@allowed([
  'Standard'
  'Premium'
])
param sku string = 'Standard'
@description('Premium: messaging units.')
@allowed([
  1
  2
  4
  8
  16
])
param messagingUnits int = 1
@description('Network isolation (Premium): deny public network access; the app reaches the namespace through a private endpoint (network.bicep).')
param restrictNetwork bool = false
@description('With restrictNetwork: public IPv4 addresses or CIDR ranges still let in (the operator CLI); empty: public network access disabled.')
param allowedIpAddresses array = []

var premium = sku == 'Premium'
var namespaceSku = premium ? {
  name: 'Premium'
  tier: 'Premium'
  capacity: messagingUnits
} : {
  name: 'Standard'
  tier: 'Standard'
}
// Without an IP rule, Deny alone would still let the whole internet in: disable public access.
var publicNetworkAccess = (restrictNetwork && empty(allowedIpAddresses)) ? 'Disabled' : 'Enabled'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: namespaceSku
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: publicNetworkAccess
  }
}

// The firewall, on a Premium namespace: with restrictNetwork deny by default and allow the listed
// addresses (the private endpoint always passes); without it allow all again, so that turning
// isolation off on a namespace that had it opens it up (a rule set left alone would stay Deny).
resource networkRules 'Microsoft.ServiceBus/namespaces/networkRuleSets@2024-01-01' = if (premium || restrictNetwork) {
  parent: namespace
  name: 'default'
  properties: {
    publicNetworkAccess: publicNetworkAccess
    defaultAction: restrictNetwork ? 'Deny' : 'Allow'
    ipRules: restrictNetwork ? map(allowedIpAddresses, ip => {
      ipMask: ip
      action: 'Allow'
    }) : []
    virtualNetworkRules: []
    trustedServiceAccessEnabled: false
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
