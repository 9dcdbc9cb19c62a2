import pytest
from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.replace_cuda_device import ReplaceCudaDevice


def test_inference_inputs_follow_the_rank_device():
    changes = assert_rewrites(
        ReplaceCudaDevice,
        """\
        inputs = tokenizer(
            [alpaca_prompt.format("Continue the sequence", "1, 1, 2, 3", "")],
            return_tensors = "pt",
        ).to("cuda")  # move to GPU
        """,
        """\
        inputs = tokenizer(
            [alpaca_prompt.format("Continue the sequence", "1, 1, 2, 3", "")],
            return_tensors = "pt",
        ).to(ddp.device)  # move to GPU
        """,
    )
    assert changes == [(4, 'replaced .to("cuda") with .to(ddp.device)')]


@pytest.mark.parametrize(
    "before, after",
    [
        ("x.cuda()", "x.to(ddp.device)"),
        ("x.cuda(0)", "x.to(ddp.device)"),
        ("x.cuda(non_blocking=True)", "x.to(ddp.device, non_blocking=True)"),
        ("x.cuda(device=0, non_blocking=True)", "x.to(ddp.device, non_blocking=True)"),
        ("x.to('cuda:0')", "x.to(ddp.device)"),
        ('x.to("cuda", torch.float16)', "x.to(ddp.device, torch.float16)"),
        ('x.to(device="cuda")', "x.to(device=ddp.device)"),
        ('torch.zeros(3, device = "cuda:0")', "torch.zeros(3, device = ddp.device)"),
        ('torch.device("cuda")', "ddp.device"),
        ('torch.device("cuda", 0)', "ddp.device"),
    ],
)
def test_cuda_devices_become_the_rank_device(before, after):
    assert_rewrites(ReplaceCudaDevice, f"y = {before}\n", f"y = {after}\n")


def test_nested_uses_are_replaced_and_recorded_at_their_lines():
    changes = assert_rewrites(
        ReplaceCudaDevice,
        """\
        for batch in loader:
            if batch:
                batch = {k: v.cuda() for k, v in batch.items()}
        device = torch.device("cuda:0")
        """,
        """\
        for batch in loader:
            if batch:
                batch = {k: v.to(ddp.device) for k, v in batch.items()}
        device = ddp.device
        """,
    )
    assert changes == [
        (3, "replaced .cuda() with .to(ddp.device)"),
        (4, 'replaced torch.device("cuda:0") with ddp.device'),
    ]


def test_other_devices_are_the_authors_choice():
    assert_unchanged(
        ReplaceCudaDevice,
        """\
        x = x.to("cpu")
        y = y.cuda(1)
        z = z.to(device)
        w = torch.device("cuda:1")
        v = torch.zeros(3, device="cpu")
        u = model.to(torch.bfloat16)
        ok = torch.cuda.is_available()
        """,
    )


def test_device_properties_of_another_device_keep_it_and_run_on_the_cpu():
    # As Muse_Glimmer_(30B)-GRPO of unslothai/notebooks sizes its run: on GPUs each index is the one written, and
    # without a GPU (device_count() is 0, so i is 0) it raised "Torch not compiled with CUDA enabled".
    changes = assert_rewrites(
        ReplaceCudaDevice,
        """        _n    = max(torch.cuda.device_count(), 1)
        _gib  = min(torch.cuda.get_device_properties(i).total_memory
                    for i in range(_n)) / 2**30
        second = torch.cuda.get_device_properties(device="cuda:1")
        """,
        """        _n    = max(torch.cuda.device_count(), 1)
        _gib  = min(ddp.device_properties(i).total_memory
                    for i in range(_n)) / 2**30
        second = ddp.device_properties(device="cuda:1")
        """,
    )
    assert changes == [
        (2, "replaced torch.cuda.get_device_properties(i) with ddp.device_properties(i) (that GPU; the CPU "
            "without one)"),
        (4, 'replaced torch.cuda.get_device_properties(device="cuda:1") with ddp.device_properties(device="cuda:1") '
            "(that GPU; the CPU without one)"),
    ]


def test_the_memory_stats_cell_of_unsloths_notebooks_reads_this_ranks_device():
    # 112 of unslothai/notebooks' notebooks open training with this cell: on rank k it read GPU 0, and without a
    # GPU it raised "Torch not compiled with CUDA enabled".
    changes = assert_rewrites(
        ReplaceCudaDevice,
        """\
        gpu_stats = torch.cuda.get_device_properties(0)
        start_gpu_memory = round(torch.cuda.max_memory_reserved() / 1024 / 1024 / 1024, 3)
        max_memory = round(gpu_stats.total_memory / 1024 / 1024 / 1024, 3)
        total = torch.cuda.get_device_properties("cuda").total_memory
        """,
        """\
        gpu_stats = ddp.device_properties()
        start_gpu_memory = round(torch.cuda.max_memory_reserved() / 1024 / 1024 / 1024, 3)
        max_memory = round(gpu_stats.total_memory / 1024 / 1024 / 1024, 3)
        total = ddp.device_properties().total_memory
        """,
    )
    assert changes == [
        (1, "replaced torch.cuda.get_device_properties(0) with ddp.device_properties() (this rank's GPU; the CPU "
            "without one)"),
        (4, 'replaced torch.cuda.get_device_properties("cuda") with ddp.device_properties() (this rank\'s GPU; '
            "the CPU without one)"),
    ]


def test_a_device_named_once_then_used_follows_the_rank():
    # As Llasa_TTS_(1B) of unslothai/notebooks writes it: on a CPU `.to(DEVICE)` failed, on N GPUs all took GPU 0.
    changes = assert_rewrites(
        ReplaceCudaDevice,
        """\
        DEVICE = "cuda"
        device: str = "cuda:0"  # the GPU
        self.eval_device = "cuda"
        codec_model = codec_model.to(DEVICE).eval()
        torch.set_default_device("cuda")
        """,
        """\
        DEVICE = ddp.device
        device: str = ddp.device  # the GPU
        self.eval_device = ddp.device
        codec_model = codec_model.to(DEVICE).eval()
        torch.set_default_device(ddp.device)
        """,
    )
    assert changes == [
        (1, 'replaced DEVICE = "cuda" with DEVICE = ddp.device'),
        (2, 'replaced device = "cuda:0" with device = ddp.device'),
        (3, 'replaced self.eval_device = "cuda" with self.eval_device = ddp.device'),
        (5, 'replaced torch.set_default_device("cuda") with torch.set_default_device(ddp.device)'),
    ]


def test_device_types_other_names_and_other_devices_are_left_alone():
    assert_unchanged(
        ReplaceCudaDevice,
        """\
        device_type = "cuda"  # torch.autocast(device_type=...) takes a string
        backend = "cuda"
        device = "cuda" if torch.cuda.is_available() else "cpu"
        second_device = "cuda:1"
        device = "cpu"
        devices[0] = "cuda"
        torch.set_default_device("cpu")
        with torch.autocast(device_type = "cuda", dtype = torch.float16):
            pass
        """,
    )
