"""Control plane: keys, the job's ZeroMQ sockets (hub, sessions), the telemetry bus, commands and the agent."""
