// sas: Scheduler Agent Supervisor on Azure Functions (Flex Consumption, Python 3.11).
// Deployed by `azd up` (azure.yaml at the repo root). See infra/README.md.
//
// Security posture: one user-assigned identity for the app, holding data-plane roles only (the
// optional simulator has one of its own, with rights on its own storage and telemetry only); no shared keys
// (storage allowSharedKeyAccess: false), no SAS/local auth (Service Bus, Application Insights
// and Log Analytics disableLocalAuth: true), no basic-auth publishing (FTP/SCM off); every app
// connection is identity-based. Diagnostic settings and alert rules report to the workspace.
// Optional network isolation (networkIsolation, off by default): storage and Service Bus without
// public network access, reached by the app through private endpoints (modules/network.bicep).

targetScope = 'subscription'

@minLength(1)
@maxLength(64)
@description('azd environment name: names the resource group and seeds a unique token.')
param environmentName string

@minLength(1)
@description('Region for every resource; it must offer the Flex Consumption plan.')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('Object id of the deploying principal (azd sets AZURE_PRINCIPAL_ID). It gets data roles only when grantDeployerDataAccess is true.')
param principalId string = ''

@description('Grant the deploying principal (principalId) data-plane roles on the table, the queues and Service Bus, to run the live contract test against these resources. Off by default: deploying needs no data access.')
param grantDeployerDataAccess bool = false

@description('Kind of principal in principalId.')
@allowed([
  'User'
  'ServicePrincipal'
])
param principalType string = 'User'

@description('Message transport: Service Bus queues (default) or Storage Queues. Only the selected transport\'s queues are provisioned.')
@allowed([
  'servicebus'
  'storage'
])
param transport string = 'servicebus'

// generated: queue prefix (make infra)
@description('Every queue\'s name starts with this and a hyphen (SAS_QUEUE_PREFIX): <prefix>-orders, <prefix>-orders-high, ... <prefix>-alerts. Lowercase letters, digits and single hyphens, a letter or digit at each end (a deployment with another fails); at most 35 characters, so that the longest queue name and its -poison queue fit 63.')
@minLength(1)
@maxLength(35)
param queuePrefix string = 'sas'
// end generated: queue prefix

@description('Table holding orders, state and steps (SAS_TABLE_NAME); its in-flight table is this name + "live".')
@minLength(3)
@maxLength(59)
param tableName string = 'sasorders'

// Each HTTP agent's remote service, as the app's workflows declare them (workflows/). The
// regions marked "generated" are written by `make infra` (sas_local/infra.py), and
// tests/unit/test_infra_consistency.py fails when they are stale.
// generated: agent parameters (make infra)
@description('Base URL of the remote inventory service (SAS_REMOTE_INVENTORY_URL); empty: the simulator\'s, with deploySimulator.')
param remoteInventoryUrl string = ''

@description('Endpoints of the inventory service, [{"name": "west", "url": "https://...", "capacity": 8}, ...] (capacity optional); empty: the one URL above (SAS_REMOTE_INVENTORY_ENDPOINTS, as JSON).')
param remoteInventoryEndpoints array = []

@description('Calls the inventory service\'s one URL takes at once; empty: no limit (SAS_REMOTE_INVENTORY_CAPACITY).')
param remoteInventoryCapacity string = ''

@description('Base URL of the remote payment service (SAS_REMOTE_PAYMENT_URL); empty: the simulator\'s, with deploySimulator.')
param remotePaymentUrl string = ''

@description('Endpoints of the payment service, [{"name": "west", "url": "https://...", "capacity": 8}, ...] (capacity optional); empty: the one URL above (SAS_REMOTE_PAYMENT_ENDPOINTS, as JSON).')
param remotePaymentEndpoints array = []

@description('Calls the payment service\'s one URL takes at once; empty: no limit (SAS_REMOTE_PAYMENT_CAPACITY).')
param remotePaymentCapacity string = ''

@description('Base URL of the remote shipping service (SAS_REMOTE_SHIPPING_URL); empty: the simulator\'s, with deploySimulator.')
param remoteShippingUrl string = ''

@description('Endpoints of the shipping service, [{"name": "west", "url": "https://...", "capacity": 8}, ...] (capacity optional); empty: the one URL above (SAS_REMOTE_SHIPPING_ENDPOINTS, as JSON).')
param remoteShippingEndpoints array = []

@description('Calls the shipping service\'s one URL takes at once; empty: no limit (SAS_REMOTE_SHIPPING_CAPACITY).')
param remoteShippingCapacity string = ''

@description('App setting WORKSPACE_DOMAIN, read by the cloud agent\'s actions (for a secret, a Key Vault reference).')
@minLength(1)
param settingWorkspaceDomain string

@description('App setting MAIL_FROM, read by the mailer agent\'s actions (for a secret, a Key Vault reference).')
@minLength(1)
param settingMailFrom string
// end generated: agent parameters

@description('NCRONTAB schedule of the supervisor timer (SAS_SUPERVISOR_SCHEDULE).')
param supervisorSchedule string = '*/15 * * * * *'

@description('Failed attempts of a step before the order goes to Error or compensation (SAS_MAX_FAILURES).')
@minValue(1)
@maxValue(100)
param maxFailures int = 3

@description('Low-priority orders are let in only while the high and normal lanes hold no message older than this many seconds (SAS_LOW_PRIORITY_BACKLOG_SECONDS, 1-300).')
param lowPriorityBacklogSeconds string = '5'

@description('The longest a low-priority order is held back by that rule, in seconds: the starvation bound (SAS_LOW_PRIORITY_MAX_DEFERRAL_SECONDS, 1-3600).')
param lowPriorityMaxDeferralSeconds string = '60'

@description('Clock-skew allowance: how far each host\'s estimate of the store\'s clock may be off; a deadline counts as passed only this long after it, and a host further off is reported (SAS_CLOCK_SKEW_SECONDS, 0-10).')
param clockSkewSeconds string = '2'

@description('Comma-separated prefixes a submitter\'s status (reply_to) queue must start with; the app\'s own queues are always refused (SAS_REPLY_TO_PREFIXES).')
param replyToPrefixes string = 'status-'

// A Service Bus trigger holds a peek-lock while its function runs; the Functions host renews
// it (host.json maxAutoLockRenewalDuration), but the lock itself should outlast the longest
// step complete-by budget (15 s, sas/domain/workflow.py) so that a slow agent never races a
// redelivery of its own request. Service Bus caps it at 5 minutes.
@description('Service Bus peek-lock duration; must be >= the longest step complete-by budget (15 s).')
@allowed([
  'PT1M'
  'PT2M'
  'PT3M'
  'PT5M'
])
param serviceBusLockDuration string = 'PT1M'

// Message ids are '{order}:{step}:{attempt}' (attempt = fencing token), so a redelivered or
// re-sent copy of the same attempt is dropped inside this window, while a retry (new attempt)
// is a new id. The window must cover the longest time over which one id can be re-sent:
// a step's complete-by budget (15 s) and the pickup budget of a Pending order (60 s).
@description('Service Bus duplicate detection window (ISO 8601, 20 s to 7 days).')
param serviceBusDuplicateDetectionWindow string = 'PT10M'

@description('Deliveries of one Service Bus message before it is dead-lettered.')
@minValue(1)
@maxValue(100)
param serviceBusMaxDeliveryCount int = 5

@description('Time to live of a Service Bus message; expired messages are dead-lettered.')
param serviceBusMessageTimeToLive string = 'P14D'

@description('Flex Consumption: maximum instances of each scaling group of the app (each queue function; the HTTP functions together).')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('Flex Consumption: memory of each instance (MB).')
@allowed([
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('E-mail address of the operators for the alert rules\' action group (SAS_ALERT_EMAIL). Empty: the action group has no receiver; the alerts still fire in Azure Monitor.')
param alertEmail string = ''

@description('Storage request logs in Log Analytics (SAS_STORAGE_LOGS): essential (blob and table deletions, queue writes, which the storage transport\'s alert rules read) or all (every request: the largest line of the bill at volume).')
@allowed([
  'essential'
  'all'
])
param storageLogs string = 'essential'

@description('Deploy the remote-service simulator as a second function app (SAS_DEPLOY_SIMULATOR: true or false), for a demo: the order workflow\'s services whose URL is left empty call it. Public and anonymous, one instance, its ledger in memory.')
param deploySimulator bool = false

@description('With deploySimulator: its faults (SAS_SIMULATOR_FAULTS, as JSON), e.g. {"transient_rate": 0.1}; empty: none.')
param simulatorFaults object = {}

// Network isolation: see infra/README.md (Network isolation) for what it costs and what it cuts off.
@description('Network isolation (SAS_NETWORK_ISOLATION): public network access off on the storage account and the Service Bus namespace, which the app reaches through private endpoints in a virtual network it is integrated with; Service Bus becomes Premium (Standard has no private endpoints). Off by default: it costs more, and the operator CLI then needs allowedIpAddresses. The app\'s HTTP endpoint stays public.')
param networkIsolation bool = false

@description('With networkIsolation: comma-separated public IPv4 addresses or CIDR ranges (203.0.113.7,198.51.100.0/24) let through the storage and Service Bus firewalls, for the operator CLI and the live contract test (SAS_ALLOWED_IP_ADDRESSES). Empty: public network access disabled outright.')
param allowedIpAddresses string = ''

@description('Service Bus tier (SAS_SERVICEBUS_SKU): Standard, or Premium (dedicated messaging units billed by the hour). networkIsolation always uses Premium. A Premium namespace is a new one (sbp-sas-*): a namespace cannot change between Standard and Premium in place.')
@allowed([
  'Standard'
  'Premium'
])
param serviceBusSku string = 'Standard'

@description('Premium Service Bus: messaging units, each billed by the hour (SAS_SERVICEBUS_MESSAGING_UNITS).')
@allowed([
  1
  2
  4
  8
  16
])
param serviceBusMessagingUnits int = 1

@description('networkIsolation: address space of the virtual network.')
param virtualNetworkAddressPrefix string = '10.0.0.0/16'

@description('networkIsolation: the function app\'s integration subnet (delegated to Microsoft.App/environments, as Flex Consumption requires); room for the app\'s instances.')
param appSubnetAddressPrefix string = '10.0.0.0/24'

@description('networkIsolation: the private endpoints\' subnet (blob, queue, table, Service Bus).')
param privateEndpointSubnetAddressPrefix string = '10.0.1.0/24'

// The prefix as sas.settings.queue_names takes it (lowercase letters, digits and single
// hyphens, a letter or digit at each end; @maxLength above bounds its length); any other
// stops the deployment here, before a queue is made that the app would not use.
var queuePrefixStrays = filter(range(0, length(queuePrefix)), i => !contains('abcdefghijklmnopqrstuvwxyz0123456789-', substring(queuePrefix, i, 1)))
var queuePrefixValid = empty(queuePrefixStrays) && !(startsWith(queuePrefix, '-') || endsWith(queuePrefix, '-') || contains(queuePrefix, '--'))
var checkedQueuePrefix = queuePrefixValid ? queuePrefix : fail('queuePrefix (SAS_QUEUE_PREFIX) takes lowercase letters, digits and single hyphens, a letter or digit at each end: the app refuses \'${queuePrefix}\'.')
// Queue names, as sas.settings.queue_names derives them from SAS_QUEUE_PREFIX and the agents:
// tests/unit/test_infra_consistency.py fails when the two drift apart. Every queue the app
// consumes has a lane per priority (high, normal, low): its own queue and its own trigger.
var consumedQueues = [
  'orders'
  'scheduler'
  'replies'
  // generated: agent queues (make infra)
  'agent-inventory'
  'agent-payment'
  'agent-shipping'
  'agent-cloud'
  'agent-mailer'
  // end generated: agent queues
]
// The queues the app consumes (its queue triggers): all but the alerts queue, which only
// operators read. Receive-side roles are scoped to exactly these queues.
var triggerQueueNames = flatten(map(consumedQueues, queue => [
  '${checkedQueuePrefix}-${queue}-high'
  '${checkedQueuePrefix}-${queue}'
  '${checkedQueuePrefix}-${queue}-low'
]))
var alertsQueueName = '${checkedQueuePrefix}-alerts'
var queueNames = concat(triggerQueueNames, [alertsQueueName])
var useServiceBus = transport == 'servicebus'
// Private endpoints need Premium; a Premium namespace gets a name of its own (a namespace keeps
// its tier), so that switching tiers creates the other namespace instead of failing.
var serviceBusPremium = networkIsolation || serviceBusSku == 'Premium'
var serviceBusNamePrefix = serviceBusPremium ? 'sbp' : 'sb'
// The firewalls' allowed addresses: the comma-separated list, trimmed, empty entries dropped.
var allowedIps = filter(map(split(allowedIpAddresses, ','), ip => trim(ip)), ip => !empty(ip))
// The in-flight table's name is the orders table's + this (sas/domain/wire.py, live_table_name).
var liveTableSuffix = 'live'
// The tables the Python agents keep their records in (PythonAgent.tables).
var appTableNames = [
  // generated: app tables (make infra)
  'workspaces'
  // end generated: app tables
]

var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}
var functionAppName = 'func-sas-${resourceToken}'
var deploymentContainerName = 'app-package-${take(functionAppName, 32)}-${take(resourceToken, 7)}'

resource rg 'Microsoft.Resources/resourceGroups@2024-11-01' = {
  name: 'rg-${environmentName}'
  location: location
  tags: tags
}

module identity 'modules/identity.bicep' = {
  name: 'identity'
  scope: rg
  params: {
    name: 'id-sas-${resourceToken}'
    location: location
    tags: tags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    logAnalyticsName: 'log-sas-${resourceToken}'
    applicationInsightsName: 'appi-sas-${resourceToken}'
    location: location
    tags: tags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    name: 'stsas${resourceToken}'
    location: location
    tags: tags
    tableName: tableName
    liveTableName: '${tableName}${liveTableSuffix}'
    appTableNames: appTableNames
    deploymentContainerName: deploymentContainerName
    queueNames: useServiceBus ? [] : queueNames
    restrictNetwork: networkIsolation
    allowedIpAddresses: networkIsolation ? allowedIps : []
  }
}

module serviceBus 'modules/servicebus.bicep' = if (useServiceBus) {
  name: 'servicebus'
  scope: rg
  params: {
    name: '${serviceBusNamePrefix}-sas-${resourceToken}'
    location: location
    tags: tags
    queueNames: queueNames
    lockDuration: serviceBusLockDuration
    duplicateDetectionHistoryTimeWindow: serviceBusDuplicateDetectionWindow
    maxDeliveryCount: serviceBusMaxDeliveryCount
    defaultMessageTimeToLive: serviceBusMessageTimeToLive
    sku: serviceBusPremium ? 'Premium' : 'Standard'
    messagingUnits: serviceBusMessagingUnits
    restrictNetwork: networkIsolation
    allowedIpAddresses: networkIsolation ? allowedIps : []
  }
}

// Network isolation: the VNet, the app's integration subnet, and private endpoints with their
// DNS zones for the storage account's blob, queue and table services and the Service Bus namespace.
module network 'modules/network.bicep' = if (networkIsolation) {
  name: 'network'
  scope: rg
  params: {
    vnetName: 'vnet-sas-${resourceToken}'
    location: location
    tags: tags
    addressPrefix: virtualNetworkAddressPrefix
    appSubnetPrefix: appSubnetAddressPrefix
    privateEndpointSubnetPrefix: privateEndpointSubnetAddressPrefix
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: useServiceBus ? serviceBus.outputs.name : ''
  }
}

// The simulator (deploySimulator): a function app of its own, with no right on sas's data; its
// telemetry goes to the same Application Insights.
module simulator 'modules/simulator.bicep' = if (deploySimulator) {
  name: 'simulator'
  scope: rg
  params: {
    location: location
    tags: tags
    resourceToken: resourceToken
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    faults: simulatorFaults
  }
}
var simulatorUrl = deploySimulator ? simulator.outputs.uri : ''

// Each HTTP agent's URL: the parameter, or the simulator's when that is empty and deployed.
// any(): Bicep would type each ternary as '' | 'simulator' | 'parameter' and refuse it against
// the module's @allowed at compile time; ARM refuses '' when it deploys (modules/remote-url.bicep).
// generated: agent urls (make infra)
module remoteInventory 'modules/remote-url.bicep' = {
  name: 'remote-url-inventory'
  scope: rg
  params: {
    source: any(empty(remoteInventoryUrl) ? (deploySimulator ? 'simulator' : '') : 'parameter')
  }
}

module remotePayment 'modules/remote-url.bicep' = {
  name: 'remote-url-payment'
  scope: rg
  params: {
    source: any(empty(remotePaymentUrl) ? (deploySimulator ? 'simulator' : '') : 'parameter')
  }
}

module remoteShipping 'modules/remote-url.bicep' = {
  name: 'remote-url-shipping'
  scope: rg
  params: {
    source: any(empty(remoteShippingUrl) ? (deploySimulator ? 'simulator' : '') : 'parameter')
  }
}
// end generated: agent urls

// The app's identity: every data role it needs, nothing else (see modules/roles.bicep).
// hostRoles: also Data Owner on each trigger queue, which target-based scaling needs to read
// queue length (never on the namespace). Receiver on the alerts queue: its depth gauge peeks it.
module appRoles 'modules/roles.bicep' = {
  name: 'roles-app'
  scope: rg
  params: {
    principalId: identity.outputs.principalId
    principalType: 'ServicePrincipal'
    storageAccountName: storage.outputs.name
    storageQueues: !useServiceBus
    serviceBusNamespaceName: useServiceBus ? serviceBus.outputs.name : ''
    triggerQueueNames: useServiceBus ? triggerQueueNames : []
    readQueueNames: useServiceBus ? [alertsQueueName] : []
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    hostRoles: true
  }
}

// The deploying principal, only on request (grantDeployerDataAccess): the app's data roles
// without the host-only ones, receive scoped to the trigger queues and the alerts queue, so
// that the live contract test, ad-hoc checks and operators reading alerts can run.
module userRoles 'modules/roles.bicep' = if (grantDeployerDataAccess && !empty(principalId)) {
  name: 'roles-user'
  scope: rg
  params: {
    principalId: principalId
    principalType: principalType
    storageAccountName: storage.outputs.name
    storageQueues: !useServiceBus
    serviceBusNamespaceName: useServiceBus ? serviceBus.outputs.name : ''
    triggerQueueNames: useServiceBus ? triggerQueueNames : []
    readQueueNames: useServiceBus ? [alertsQueueName] : []
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    hostRoles: false
  }
}

// The settings sas reads (sas/settings.py) that this deployment sets: the ones it needs and
// the ones that differ from the code's defaults. Connections are identity-based
// (<Conn>__tableServiceUri / __queueServiceUri / __fullyQualifiedNamespace + __credential +
// __clientId), resolved with azure-identity by the app and by the Functions host's triggers.
var sasSettings = {
  SAS_TRANSPORT: transport
  SAS_TABLE_NAME: tableName
  SAS_SUPERVISOR_SCHEDULE: supervisorSchedule
  // generated: agent settings (make infra)
  SAS_REMOTE_INVENTORY_URL: ('parameter' == remoteInventory.outputs.source) ? remoteInventoryUrl : '${simulatorUrl}/inventory'
  SAS_REMOTE_PAYMENT_URL: ('parameter' == remotePayment.outputs.source) ? remotePaymentUrl : '${simulatorUrl}/payment'
  SAS_REMOTE_SHIPPING_URL: ('parameter' == remoteShipping.outputs.source) ? remoteShippingUrl : '${simulatorUrl}/shipping'
  WORKSPACE_DOMAIN: settingWorkspaceDomain
  MAIL_FROM: settingMailFrom
  // end generated: agent settings
  SasStorage__tableServiceUri: storage.outputs.tableEndpoint
  SasStorage__queueServiceUri: storage.outputs.queueEndpoint
  SasStorage__credential: 'managedidentity'
  SasStorage__clientId: identity.outputs.clientId
}
var optionalSettings = {
  SAS_QUEUE_PREFIX: (checkedQueuePrefix == 'sas') ? '' : checkedQueuePrefix
  SAS_MAX_FAILURES: (maxFailures == 3) ? '' : string(maxFailures)
  SAS_CLOCK_SKEW_SECONDS: (clockSkewSeconds == '2') ? '' : clockSkewSeconds
  SAS_REPLY_TO_PREFIXES: (replyToPrefixes == 'status-') ? '' : replyToPrefixes
  // generated: agent options (make infra)
  SAS_REMOTE_INVENTORY_ENDPOINTS: empty(remoteInventoryEndpoints) ? '' : string(remoteInventoryEndpoints)
  SAS_REMOTE_INVENTORY_CAPACITY: remoteInventoryCapacity
  SAS_REMOTE_PAYMENT_ENDPOINTS: empty(remotePaymentEndpoints) ? '' : string(remotePaymentEndpoints)
  SAS_REMOTE_PAYMENT_CAPACITY: remotePaymentCapacity
  SAS_REMOTE_SHIPPING_ENDPOINTS: empty(remoteShippingEndpoints) ? '' : string(remoteShippingEndpoints)
  SAS_REMOTE_SHIPPING_CAPACITY: remoteShippingCapacity
  // end generated: agent options
  SAS_LOW_PRIORITY_BACKLOG_SECONDS: (lowPriorityBacklogSeconds == '5') ? '' : lowPriorityBacklogSeconds
  SAS_LOW_PRIORITY_MAX_DEFERRAL_SECONDS: (lowPriorityMaxDeferralSeconds == '60') ? '' : lowPriorityMaxDeferralSeconds
}
// Only the optional settings that are set: an app setting left out is the code's default.
var changedSettings = toObject(
  filter(items(optionalSettings), setting => !empty(setting.value)),
  setting => setting.key,
  setting => setting.value
)
var serviceBusSettings = useServiceBus ? {
  SasServiceBus__fullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
  SasServiceBus__credential: 'managedidentity'
  SasServiceBus__clientId: identity.outputs.clientId
} : {}
var appSettings = union(sasSettings, changedSettings, serviceBusSettings)

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  scope: rg
  params: {
    name: functionAppName
    planName: 'plan-sas-${resourceToken}'
    location: location
    tags: tags
    serviceName: 'api'
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageAccountName: storage.outputs.name
    deploymentContainerName: deploymentContainerName
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    appSettings: appSettings
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    // The network module's output: the app starts once its private endpoints and DNS are there.
    virtualNetworkSubnetId: networkIsolation ? network.outputs.appSubnetId : ''
  }
  // The host reaches its storage with the identity as soon as it starts: grant first.
  dependsOn: [
    appRoles
  ]
}

// Logs and metrics of the app, the namespace and the storage account into the workspace.
module diagnostics 'modules/diagnostics.bicep' = {
  name: 'diagnostics'
  scope: rg
  params: {
    logAnalyticsId: monitoring.outputs.logAnalyticsId
    functionAppName: functionApp.outputs.name
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: useServiceBus ? serviceBus.outputs.name : ''
    storageLogs: storageLogs
  }
}

// Alert rules: the operator-alert log event, dead-lettered messages and the alerts queue.
module alerts 'modules/alerts.bicep' = {
  name: 'alerts'
  scope: rg
  params: {
    namePrefix: 'sas-${resourceToken}'
    location: location
    tags: tags
    alertEmail: alertEmail
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    logAnalyticsName: monitoring.outputs.logAnalyticsName
    serviceBusNamespaceName: useServiceBus ? serviceBus.outputs.name : ''
    queueNames: useServiceBus ? queueNames : []
    storageQueues: !useServiceBus
    alertsQueueName: alertsQueueName
  }
  // The storage queue rules read StorageQueueLogs, which the diagnostic settings create.
  dependsOn: [
    diagnostics
  ]
}

// Outputs azd stores in .azure/<env>/.env
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.name
output AZURE_FUNCTION_NAME string = functionApp.outputs.name
output SERVICE_API_NAME string = functionApp.outputs.name
output SERVICE_API_ENDPOINTS array = [
  functionApp.outputs.uri
]
output SAS_API_URL string = functionApp.outputs.uri
output SAS_SIMULATOR_URL string = simulatorUrl
output SAS_TRANSPORT string = transport
output SAS_TABLE_NAME string = tableName
output AZURE_STORAGE_ACCOUNT_NAME string = storage.outputs.name
output AZURE_STORAGE_TABLE_ENDPOINT string = storage.outputs.tableEndpoint
output AZURE_STORAGE_QUEUE_ENDPOINT string = storage.outputs.queueEndpoint
output AZURE_SERVICEBUS_NAMESPACE string = useServiceBus ? serviceBus.outputs.fullyQualifiedNamespace : ''
output AZURE_MANAGED_IDENTITY_CLIENT_ID string = identity.outputs.clientId
output APPLICATIONINSIGHTS_NAME string = monitoring.outputs.applicationInsightsName
