"""The PyTorch loop (`torch_loop`, with `torch_parts` and `torch_speed`) and the strategies that
run on it as plug-ins: single, DataParallel, DDP, FSDP2 (`pytorch`), pipeline, DeepSpeed ZeRO,
Horovod, and Lightning's own loop; `exposed` measures the communication a step waits for."""
