// Network isolation (main.bicep networkIsolation, off by default): a virtual network with two
// subnets, the function app's outbound VNet integration in one, private endpoints in the other:
// the storage account's blob (host storage and the Flex deployment package), queue and table
// services, and the Service Bus namespace (servicebus transport; Premium only: Standard has no
// private endpoints). A private DNS zone per service, linked to the VNet, resolves each public
// host name to its private endpoint inside the VNet, so the app's settings keep the usual
// endpoints. The accounts' public network access is switched off in storage.bicep and
// servicebus.bicep; the app's inbound HTTP endpoint stays public. See infra/README.md.

param vnetName string
param location string
param tags object = {}
@description('Address space of the virtual network.')
param addressPrefix string = '10.0.0.0/16'
@description('The function app\'s integration subnet (inside addressPrefix).')
param appSubnetPrefix string = '10.0.0.0/24'
@description('The private endpoints\' subnet (inside addressPrefix).')
param privateEndpointSubnetPrefix string = '10.0.1.0/24'
@description('The storage account: private endpoints for its blob, queue and table services.')
param storageAccountName string
@description('The Service Bus namespace (Premium); empty for the storage transport.')
param serviceBusNamespaceName string = ''

// Flex Consumption: the integration subnet is delegated to Microsoft.App/environments (not
// Microsoft.Web/serverFarms), used by nothing else, and its name has no underscore.
var appSubnetName = 'snet-app'
var privateEndpointSubnetName = 'snet-private-endpoints'
var storageDnsSuffix = environment().suffixes.storage
var storageTargets = [
  {
    name: 'pe-${storageAccountName}-blob'
    groupId: 'blob'
    serviceId: storage.id
    zone: 'privatelink.blob.${storageDnsSuffix}'
  }
  {
    name: 'pe-${storageAccountName}-queue'
    groupId: 'queue'
    serviceId: storage.id
    zone: 'privatelink.queue.${storageDnsSuffix}'
  }
  {
    name: 'pe-${storageAccountName}-table'
    groupId: 'table'
    serviceId: storage.id
    zone: 'privatelink.table.${storageDnsSuffix}'
  }
]
// The Service Bus zone of the public cloud (<namespace>.servicebus.windows.net).
var serviceBusTargets = empty(serviceBusNamespaceName) ? [] : [
  {
    name: 'pe-${serviceBusNamespaceName}-namespace'
    groupId: 'namespace'
    serviceId: serviceBus.id
    zone: 'privatelink.servicebus.windows.net'
  }
]
// One private endpoint, one DNS zone, one VNet link and one zone group per target, by index.
var targets = concat(storageTargets, serviceBusTargets)

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource vnet 'Microsoft.Network/virtualNetworks@2024-01-01' = {
  name: vnetName
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: appSubnetName
        properties: {
          addressPrefix: appSubnetPrefix
          delegations: [
            {
              name: 'flex-consumption'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
      {
        name: privateEndpointSubnetName
        properties: {
          addressPrefix: privateEndpointSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
        }
      }
    ]
  }
}

resource privateDnsZones 'Microsoft.Network/privateDnsZones@2020-06-01' = [for target in targets: {
  name: target.zone
  location: 'global'
  tags: tags
}]

resource vnetLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = [for (target, i) in targets: {
  parent: privateDnsZones[i]
  name: 'link-${vnetName}'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: vnet.id
    }
  }
}]

resource privateEndpoints 'Microsoft.Network/privateEndpoints@2024-01-01' = [for target in targets: {
  name: target.name
  location: location
  tags: tags
  properties: {
    subnet: {
      id: '${vnet.id}/subnets/${privateEndpointSubnetName}'
    }
    privateLinkServiceConnections: [
      {
        name: target.name
        properties: {
          privateLinkServiceId: target.serviceId
          groupIds: [
            target.groupId
          ]
        }
      }
    ]
  }
}]

// The endpoint's A record in its zone, kept by the platform for the endpoint's lifetime.
resource privateDnsZoneGroups 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-01-01' = [for (target, i) in targets: {
  parent: privateEndpoints[i]
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: replace(target.zone, '.', '-')
        properties: {
          privateDnsZoneId: privateDnsZones[i].id
        }
      }
    ]
  }
}]

output vnetId string = vnet.id
output appSubnetId string = '${vnet.id}/subnets/${appSubnetName}'
output privateEndpointSubnetId string = '${vnet.id}/subnets/${privateEndpointSubnetName}'
output privateEndpointNames array = [for target in targets: target.name]
