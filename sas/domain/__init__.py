"""Pure domain: state machine, workflow definitions, messages. No I/O, no azure imports."""
