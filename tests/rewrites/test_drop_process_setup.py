import pytest
from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.drop_process_setup import DropProcessSetup


def test_a_notebooks_own_ddp_setup_gives_way_to_the_runtimes():
    changes = assert_rewrites(
        DropProcessSetup,
        """\
        import torch.distributed as dist
        # one process per GPU
        dist.init_process_group("nccl")
        torch.cuda.set_device(0)
        local_rank = int(os.environ["LOCAL_RANK"])
        """,
        """\
        import torch.distributed as dist
        # one process per GPU
        # nbddp: dropped dist.init_process_group("nccl")
        # nbddp: dropped torch.cuda.set_device(0)
        local_rank = int(os.environ["LOCAL_RANK"])
        """,
    )
    assert changes == [
        (3, 'dropped dist.init_process_group("nccl"): ddp joined the process group already: nccl on GPUs, gloo on CPU'),
        (4, "dropped torch.cuda.set_device(0): ddp set this rank's own GPU already (cuda:<local_rank>; none on CPU)"),
    ]


def test_a_block_of_setup_only_keeps_a_statement():
    changes = assert_rewrites(
        DropProcessSetup,
        """\
        if not dist.is_initialized():
            torch.distributed.init_process_group(backend="nccl", timeout=timedelta(minutes=30))
        print("ready")
        init_process_group("nccl"); torch.cuda.set_device(torch.device("cuda"))
        dist.destroy_process_group()
        """,
        """\
        if not dist.is_initialized():
            pass  # nbddp: dropped torch.distributed.init_process_group(backend="nccl", timeout=timedelta(minutes=30))
        print("ready")
        # nbddp: dropped init_process_group("nccl"); torch.cuda.set_device(torch.device("cuda"))
        # nbddp: dropped dist.destroy_process_group()
        """,
    )
    assert [line for line, _ in changes] == [2, 4, 4, 5]
    assert changes[-1][1] == ("dropped dist.destroy_process_group(): ddp.shutdown() leaves the process group at the "
                              "end of the script")


@pytest.mark.parametrize("device", ['"cuda"', '"cuda:0"', "0", 'torch.device("cuda", 0)'])
def test_set_device_to_the_first_gpu_is_dropped(device):
    assert_rewrites(DropProcessSetup, f"torch.cuda.set_device({device})\nx = 1\n",
                    f"# nbddp: dropped torch.cuda.set_device({device})\nx = 1\n")


def test_other_devices_and_other_uses_are_left_alone():
    assert_unchanged(
        DropProcessSetup,
        """\
        torch.cuda.set_device(local_rank)  # the notebook's own LOCAL_RANK choice: right on GPUs
        torch.cuda.set_device(1)
        world = dist.get_world_size()
        dist.barrier()
        group = dist.new_group([0, 1])
        ok = dist.is_initialized() or dist.init_process_group("gloo")
        """,
    )
