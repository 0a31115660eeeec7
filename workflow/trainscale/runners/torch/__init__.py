"""The PyTorch loop (`torch_loop`, with `torch_parts` and `torch_speed`) and the strategies that
run on it as plug-ins: single, DataParallel, DDP, FSDP2 (`pytorch`), pipeline, tensor
parallelism, DeepSpeed ZeRO, Horovod; Lightning's own loop (`lightning/`); `exposed` measures the
communication a step waits for; `memory/` traces a step for the planner's memory prediction."""
