"""sas: the Scheduler Agent Supervisor pattern as an Azure Functions app."""
