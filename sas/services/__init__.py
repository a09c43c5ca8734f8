"""Services: scheduler, agent runner, submission. They depend only on the ports."""
