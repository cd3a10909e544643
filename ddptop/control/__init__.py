"""Control plane over torch.distributed's TCPStore: keys, the telemetry bus, handshake and commands."""
