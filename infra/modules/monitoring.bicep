// Log Analytics + workspace-based Application Insights with local (instrumentation key) auth
// disabled: telemetry is accepted only from Entra-authenticated senders, i.e. the app's
// identity with Monitoring Metrics Publisher (APPLICATIONINSIGHTS_AUTHENTICATION_STRING).
// The workspace has local auth (workspace keys) disabled too: queries and ingestion use Entra
// ID (diagnostic settings and Application Insights write to it as Azure services).

param logAnalyticsName string
param applicationInsightsName string
param location string
param tags object = {}
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    retentionInDays: retentionInDays
    sku: {
      name: 'PerGB2018'
    }
    features: {
      disableLocalAuth: true
    }
  }
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    DisableLocalAuth: true
  }
}

output applicationInsightsName string = applicationInsights.name
output applicationInsightsId string = applicationInsights.id
output logAnalyticsId string = logAnalytics.id
output logAnalyticsName string = logAnalytics.name
