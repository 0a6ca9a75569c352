"""gRPC servicers: they validate what SQL cannot see, call the engine, and translate."""
