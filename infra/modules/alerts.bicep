// Alert rules for operators, all notifying one action group:
// - a log alert on the operator-alert event: the app logs every OperatorAlert at ERROR as
//   'sas.operator_alert ...' (a trace in Application Insights; host.json never samples traces);
// - servicebus transport: metric alerts on dead-lettered messages in the app's queues and on
//   messages waiting in the alerts queue (ActiveMessages, EntityName = the alerts queue);
// - storage transport: Storage Queues publish no per-queue depth metric (QueueMessageCount is
//   account-wide and hourly), so the equivalents are log alerts on StorageQueueLogs (filled by
//   diagnostics.bicep): a message put on the alerts queue, and a message moved to a -poison
//   queue (the storage transport's dead-lettering).

param namePrefix string
param location string
param tags object = {}
@description('E-mail address of the operators; empty: the action group has no receiver.')
param alertEmail string = ''
param applicationInsightsName string
param logAnalyticsName string
@description('Service Bus namespace; empty for the storage transport.')
param serviceBusNamespaceName string = ''
@description('The app\'s Service Bus queues, watched for dead-lettered messages.')
param queueNames array = []
@description('Storage transport: alert from the storage queue logs instead of Service Bus metrics.')
param storageQueues bool = false
@description('Name of the alerts queue (SAS_QUEUE_ALERTS).')
param alertsQueueName string

var useServiceBus = !empty(serviceBusNamespaceName)
// The queue of a StorageQueueLogs row: the first path segment of its request URI.
var storageQueueOfRow = 'extend Queue = tostring(split(tostring(parse_url(Uri).Path), "/")[1])'

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' existing = {
  name: logAnalyticsName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: '${namePrefix}-operators'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'sas-ops'
    enabled: true
    emailReceivers: empty(alertEmail) ? [] : [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

// Every operator alert, on either transport. The window overlaps the previous evaluation so
// that a late-ingested trace is still counted (at worst an alert notifies twice).
resource operatorAlertRule 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-operator-alert'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'sas: operator alert'
    description: 'The app raised an OperatorAlert (logged as sas.operator_alert): an order needs a human. See the alerts queue and `sas orders list --state Error`.'
    severity: 1
    enabled: true
    scopes: [
      applicationInsights.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT10M'
    criteria: {
      allOf: [
        {
          query: 'traces | where message has "sas.operator_alert"'
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

resource deadLetterAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = if (useServiceBus) {
  name: '${namePrefix}-dead-lettered'
  location: 'global'
  tags: tags
  properties: {
    description: 'A message was dead-lettered in one of the app\'s Service Bus queues (max delivery count or expiry).'
    severity: 2
    enabled: true
    scopes: [
      serviceBus.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'dead-lettered'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: queueNames
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    autoMitigate: true
    actions: [
      {
        actionGroupId: actionGroup.id
      }
    ]
  }
}

resource alertsQueueAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = if (useServiceBus) {
  name: '${namePrefix}-alerts-queue'
  location: 'global'
  tags: tags
  properties: {
    description: 'Operator alerts are waiting in the alerts queue.'
    severity: 1
    enabled: true
    scopes: [
      serviceBus.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'alerts-waiting'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'ActiveMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                alertsQueueName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    autoMitigate: true
    actions: [
      {
        actionGroupId: actionGroup.id
      }
    ]
  }
}

// StorageQueueLogs may hold no row yet when this is deployed: skip the creation-time check.
resource storageAlertsQueueRule 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = if (storageQueues) {
  name: '${namePrefix}-alerts-queue-log'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'sas: message on the alerts queue'
    description: 'An operator alert was put on the alerts Storage Queue.'
    severity: 1
    enabled: true
    scopes: [
      logAnalytics.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT10M'
    criteria: {
      allOf: [
        {
          query: 'StorageQueueLogs | where OperationName == "PutMessage" | ${storageQueueOfRow} | where Queue == "${alertsQueueName}"'
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    skipQueryValidation: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

resource storagePoisonRule 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = if (storageQueues) {
  name: '${namePrefix}-poison'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'sas: message moved to a poison queue'
    description: 'The Functions host gave up on a Storage Queue message and moved it to <queue>-poison.'
    severity: 2
    enabled: true
    scopes: [
      logAnalytics.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT10M'
    criteria: {
      allOf: [
        {
          query: 'StorageQueueLogs | where OperationName == "PutMessage" | ${storageQueueOfRow} | where Queue endswith "-poison"'
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    skipQueryValidation: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

output actionGroupId string = actionGroup.id
