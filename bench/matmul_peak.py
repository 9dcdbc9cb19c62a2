"""Dense bf16 matmul rate of each visible GPU, measured the way the MFU denominators need it.

    python -m bench.matmul_peak --size 8192 --repeats 30     # prints one JSON object

nbddp.runtime.reporting.utilization.measure_matmul_peak, the one the training's MFU is computed against.
"""
import argparse
import json

from nbddp.runtime.reporting.utilization import measure_matmul_peak


def main():
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    results = [measure_matmul_peak(torch.device("cuda", i), args.size, args.repeats)
               for i in range(torch.cuda.device_count())]
    print(json.dumps({"per_gpu": results}))


if __name__ == "__main__":
    main()
