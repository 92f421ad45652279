"""What the test folders share (on sys.path through pytest's `pythonpath = ["tests"]`): repository paths,
executor helpers, the CPU vLLM helpers and process checks. The shipped test kit is tuner.testing."""
