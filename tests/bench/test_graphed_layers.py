"""bench/graphed_layers.py's CPU-side parts: the bucket's padding sequence, the table a replay copies in, the layer
stack's fixed arguments, the comparison, and a failing stage recorded instead of raised."""
import pytest
import torch

from bench import graphed_layers


def test_a_micro_batch_is_padded_to_its_bucket_with_one_more_sequence():
    table, positions = graphed_layers.padded((3, 2), 8)
    assert table == (3, 2, 3)
    assert positions == [0, 1, 2, 0, 1, 0, 1, 2]
    assert graphed_layers.padded(graphed_layers.LENGTHS, graphed_layers.BUCKET)[0][-1] == 26
    assert sum(graphed_layers.OTHER_LENGTHS) < graphed_layers.BUCKET
    with pytest.raises(ValueError, match="8 tokens do not leave room"):
        graphed_layers.padded((5, 3), 8)


def test_a_replays_table_is_copied_into_the_captured_tensors_in_place():
    tensors = {"lengths": torch.zeros(3, dtype=torch.int32), "seq_lengths": torch.zeros(3, dtype=torch.int32),
               "cu_seqlens": torch.zeros(4, dtype=torch.int32), "position_ids": torch.zeros(1, 8, dtype=torch.long)}
    storage = {name: tensor.data_ptr() for name, tensor in tensors.items()}
    graphed_layers.load_table(torch, tensors, *graphed_layers.padded((3, 2), 8))
    assert tensors["lengths"].tolist() == tensors["seq_lengths"].tolist() == [3, 2, 3]
    assert tensors["cu_seqlens"].tolist() == [0, 3, 5, 8]
    assert tensors["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert {name: tensor.data_ptr() for name, tensor in tensors.items()} == storage  # what the graphs read


def test_the_layer_stack_runs_every_layer_with_the_micro_batchs_arguments():
    seen = []

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, hidden, **kwargs):
            seen.append(sorted(kwargs))
            return (hidden * self.weight,)

    inner = torch.nn.Module()
    inner.layers = torch.nn.ModuleList([Layer(), Layer()])
    model = type("Peft", (), {})()
    model.base_model = type("Lora", (), {})()
    model.base_model.model = type("CausalLM", (), {"model": inner})()
    stack = graphed_layers.layer_stack(torch, model, {"position_ids": 1, "packed_seq_lengths": 2})
    assert stack(torch.ones(1, 2, 3)).eq(4).all()
    assert seen == [["packed_seq_lengths", "position_ids"]] * 2
    assert len(list(stack.parameters())) == 2  # the layers' own: their gradients come out of the graphs


def test_a_chain_calls_the_graphed_layers_in_turn():
    assert graphed_layers.chain([lambda h: h + 1, lambda h: h * 3])(torch.tensor(1.0)) == 6


def test_the_buckets_micro_batches_fit_with_a_padding_sequence():
    for bucket, lengths in graphed_layers.BUCKETS.items():
        assert graphed_layers.padded(lengths, bucket)[0][-1] >= 1
    assert len(set(map(len, graphed_layers.BUCKETS.values()))) == 1  # a bucket's graphs hold its table's size


def test_the_difference_is_over_the_real_rows_and_every_gradient():
    eager = (torch.tensor([[[1.0], [2.0], [9.0]]]), [torch.tensor([4.0, -2.0])])
    graphed = (torch.tensor([[[1.0], [2.5], [0.0]]]), [torch.tensor([4.0, -1.0])])
    assert graphed_layers.largest_difference(graphed, eager, rows=2) == pytest.approx(0.25)  # |-1 - -2| / 4
    graphed = (torch.tensor([[[1.0], [1.0], [0.0]]]), [torch.tensor([4.0, -2.0])])
    assert graphed_layers.largest_difference(graphed, eager, rows=2) == pytest.approx(0.5)  # the padding row: out


def test_a_stage_that_raises_is_recorded_not_raised():
    record = {}
    assert graphed_layers.stage(record, "ok", lambda: 3) == 3
    assert graphed_layers.stage(record, "capture", lambda: 1 / 0) is None
    assert record["errors"] == {"capture": "ZeroDivisionError: division by zero"}
    assert "1 / 0" in record["tracebacks"]["capture"]


def test_a_stage_that_fails_while_handling_an_error_names_both():
    record = {}

    def capture():
        try:
            raise RuntimeError("operation not permitted when stream is capturing")
        finally:
            raise RuntimeError("operation failed due to a previous error during capture")

    graphed_layers.stage(record, "capture", capture)
    assert record["errors"]["capture"] == ("RuntimeError: operation failed due to a previous error during capture "
                                           "(during: RuntimeError: operation not permitted when stream is capturing)")


def test_a_steps_difference_is_over_its_losses_and_gradients():
    eager = ([2.0, 4.0], [torch.tensor([1.0, -4.0])])
    assert graphed_layers.step_difference(([2.0, 4.2], [torch.tensor([1.0, -4.0])]), eager) == pytest.approx(0.05)
    assert graphed_layers.step_difference(([2.0, 4.0], [torch.tensor([2.0, -4.0])]), eager) == pytest.approx(0.25)


def test_the_runtime_steps_first_two_micro_batches_share_a_bucket():
    from nbddp.runtime.graphed_layers import bucket_size

    first, second = graphed_layers.RUNTIME_STEPS[0]
    assert bucket_size(sum(first)) == bucket_size(sum(second)) and len(first) == len(second)
    assert bucket_size(sum(graphed_layers.RUNTIME_STEPS[1][0])) != bucket_size(sum(first))


def test_the_lever_left_eager_pads_and_cuts_back_then_gives_the_layers_their_forward_again():
    from nbddp.runtime import graphed_layers as lever
    from tests.runtime import test_graphed_layers as stand_ins

    layers = stand_ins.model_of(2)
    hidden, grad = torch.randn(1, 6, 4), torch.randn(1, 6, 4)
    plain = stand_ins.step(layers, (2, 4), hidden, grad)
    options = {"pin": lambda table, device: None, "route_check": stand_ins.no_check}
    through = graphed_layers.lever_left_eager(lever, layers, torch.device("cpu"),
                                              lambda: stand_ins.step(layers, (2, 4), hidden, grad), 1, **options)
    torch.testing.assert_close(through, plain)
    assert all("forward" not in vars(layer) for layer in layers)
    with torch.no_grad(), pytest.raises(RuntimeError, match="the eager lever took 0 of 1 micro batches"):
        graphed_layers.lever_left_eager(lever, layers, torch.device("cpu"),
                                        lambda: stand_ins.run(layers, (2, 4), hidden), 1, **options)
