"""Tests: real chDB, real gRPC on loopback, real multi-process torch.distributed jobs."""
