"""Benchmarks of rdvpump beside the libraries users would pick instead (JSON lines out)."""
