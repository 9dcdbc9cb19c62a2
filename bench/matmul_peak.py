"""Dense bf16 matmul rate of each visible GPU, measured the way the MFU denominators need it.

    python -m bench.matmul_peak --size 8192 --repeats 30     # prints one JSON object

Random normal inputs (zeros run faster), three input pairs in rotation, CUDA events around each
product after a warm-up, median over the repeats.
"""
import argparse
import json
import statistics


def measure(device, size, repeats, warmup=5):
    import torch

    generator = torch.Generator(device=device).manual_seed(0)
    pairs = [
        (torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator),
         torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator))
        for _ in range(3)
    ]
    out = torch.empty(size, size, device=device, dtype=torch.bfloat16)
    with torch.cuda.device(device):
        for i in range(warmup):
            torch.matmul(*pairs[i % 3], out=out)
        times_ms = []
        for i in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(*pairs[i % 3], out=out)
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
    flops = 2 * size ** 3
    rates = [flops / (t / 1e3) for t in times_ms]
    return {"device": torch.cuda.get_device_name(device), "size": size, "repeats": repeats,
            "median_flops_per_s": statistics.median(rates), "min_flops_per_s": min(rates),
            "max_flops_per_s": max(rates)}


def main():
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    results = [measure(torch.device("cuda", i), args.size, args.repeats) for i in range(torch.cuda.device_count())]
    print(json.dumps({"per_gpu": results}))


if __name__ == "__main__":
    main()
