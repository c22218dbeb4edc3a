"""Relative training speed of GPU families, for converting runtimes between GPU models.

``RELATIVE_SPEED[family]`` is the training throughput of one GPU of that family relative to one
V100 (= 1.0). A job that ran ``t`` seconds on a V100 is modelled to run ``t / speed`` on a GPU
of speed ``speed``: :func:`convert_runtime`. Pure: no I/O.

These are single-number summaries of workloads whose speedups differ widely (memory-bound vs
compute-bound, mixed precision or not); treat them as a reasonable central estimate, not as a
prediction for any one model.

Sources
-------

[L] Lambda, "Deep Learning GPU Benchmarks", PyTorch training, 2023 (NGC PyTorch 22.10 image,
    CUDA 11.8; https://lambdalabs.com/gpu-benchmarks; data in github.com/lambdal/
    deeplearning-benchmark, ``pytorch/pytorch-train-throughput-fp16.csv``). Value = geometric
    mean, over seven mixed-precision single-GPU training benchmarks (SSD, BERT-base and
    BERT-large SQuAD, GNMT, ResNet-50, Transformer-XL base and large), of the throughput relative
    to Lambda's V100 16GB. Tacotron2/WaveGlow (speech) and NCF are left out: their V100 baseline
    is an outlier. Measured, per GPU (x1 rows).
[M] MLCommons MLPerf Training results as reported by NVIDIA: v4.0 (June 2024, H200 "up to 47%"
    faster than H100, Llama 2 70B LoRA) and v4.1 (November 2024, B200 per-GPU 2.0x H100 on
    GPT-3 175B pre-training, 2.2x on Llama 2 70B LoRA, 1.7x on Stable Diffusion v2).
[T] TensorFlow's official tf_cnn_benchmarks results (tensorflow.org/performance/benchmarks,
    2017): ResNet-50, synthetic data, FP32, batch 64, one GPU: P100 (DGX-1) 219 images/s, K80
    (Google Compute Engine) 52 images/s (one GK210 of a K80 board). V100 FP32 ResNet-50 from
    [L]'s FP32 table (``pytorch-train-throughput-fp32.csv``): 369 images/s.
[D] NVIDIA product data sheets (dense FP16 Tensor Core TFLOPS, memory bandwidth): used only for
    GPUs without a direct benchmark above, and marked approximate.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.model.gpus import family_of

BASELINE = "V100"

RELATIVE_SPEED: dict[str, float] = {
    # [T] FP32 ResNet-50: 52 / 369. Kepler, no tensor cores; approximate (different frameworks).
    "K80": 0.14,
    # [T] FP32 ResNet-50: 219 / 369. Pascal, no tensor cores; against a V100 using mixed
    # precision the gap is about twice as large. Approximate.
    "P100": 0.6,
    # [D] approximate: 65 vs 125 FP16 tensor TFLOPS (0.52), 320 vs 900 GB/s (0.36), and a 70 W
    # power limit that lowers sustained clocks in training; taken a little below both ratios.
    "T4": 0.3,
    # [L] 1.00 by definition (V100 16GB; the 32GB model has the same chip and clocks).
    "V100": 1.0,
    # [D] approximate: AWS's A10G is the same GA102 part with the same 24 GB GDDR6 as the A10;
    # taken as equal to the A10 of [L].
    "A10G": 0.8,
    # [L] measured: 0.80 (Lambda Cloud A10).
    "A10": 0.8,
    # [D] approximate: 121 FP16 tensor TFLOPS (like the A10's 125) but 300 GB/s (half the
    # A10's 600 GB/s); about 0.7 x A10.
    "L4": 0.55,
    # [D] approximate: the RTX A6000's GA102 chip at lower clocks and 696 vs 768 GB/s; about
    # 0.9 x the RTX A6000 of [L].
    "A40": 1.15,
    # [L] measured: 1.29 (RTX A6000).
    "A6000": 1.3,
    # [D] approximate: the AD102 chip of the RTX 6000 Ada, which [L] measures at 1.70, with a
    # higher power limit; taken as equal.
    "L40S": 1.7,
    # [L] measured: 2.43 (A100 80GB SXM4; the 80GB PCIe card is 2.30, the 40GB PCIe 2.0).
    "A100": 2.4,
    # [L] measured: 4.24 (H100 80GB SXM5; the PCIe card is about 3.1).
    "H100": 4.2,
    # [M] approximate: H100 x 1.3 (MLPerf Training v4.0: "up to 47%" more than H100, less on
    # compute-bound models; more memory bandwidth, same compute).
    "H200": 5.5,
    # [M] approximate: H100 x 2.0 (MLPerf Training v4.1 per-GPU, GPT-3 175B pre-training).
    "B200": 8.4,
    # [L] measured: 1.83 (RTX 4090).
    "RTX4090": 1.8,
}


def speed_of(model: str) -> float:
    """Relative speed of a GPU model or family (``A100-80GB``, ``a100``); unknown: 1.0."""
    return RELATIVE_SPEED.get(family_of(model.strip()), 1.0)


def convert_runtime(seconds: float, from_model: str | None, to_model: str) -> float:
    """The runtime on ``to_model`` of work that took ``seconds`` on ``from_model``.

    ``from_model`` None means the runtime was not measured on a known GPU: it is returned
    unchanged (speed-neutral).
    """
    if from_model is None:
        return seconds
    return seconds * speed_of(from_model) / speed_of(to_model)


def fastest_first(models: Iterable[str]) -> list[str]:
    """``models`` sorted by speed, fastest first; equally fast models keep their order."""
    return sorted(models, key=lambda m: -speed_of(m))
