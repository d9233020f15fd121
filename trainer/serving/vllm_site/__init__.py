"""A ``sitecustomize`` for the vLLM server processes agl-bridge starts (see vllm_cpu_lora)."""
