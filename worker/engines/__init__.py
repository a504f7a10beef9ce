"""Engine implementations: mocker, hf (transformers + peft) and vllm."""
