"""Client-side tools that talk to a running broker over AMQP and the management API."""
