from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.record_metrics import RecordMetrics


def test_a_trainer_without_callbacks_records_nbddps_metrics():
    changes = assert_rewrites(
        RecordMetrics,
        """\
        trainer = SFTTrainer(
            model = model,
            train_dataset = dataset,
            args = SFTConfig(output_dir = "outputs"),
        )
        """,
        """\
        trainer = SFTTrainer(
            model = model,
            train_dataset = dataset,
            args = SFTConfig(output_dir = "outputs"),
            callbacks = [ddp.metrics_callback()],
        )
        """,
    )
    assert changes == [(1, "added callbacks=[ddp.metrics_callback()] (loss, tokens/s and memory per step in "
                           "<output_dir>/metrics.jsonl, which pipeline.py run and regress read)")]


def test_a_positional_model_counts_as_a_trainer():
    assert_rewrites(RecordMetrics, "trainer = Trainer(model, args)\n",
                    "trainer = Trainer(model, args, callbacks=[ddp.metrics_callback()])\n")


def test_the_authors_callbacks_double_star_arguments_and_other_classes_are_left_alone():
    assert_unchanged(
        RecordMetrics,
        """\
        trainer = SFTTrainer(model = model, callbacks = [MetricsCallback(f"{output_dir}/metrics.jsonl")])
        trainer = GRPOTrainer(model = model, **kwargs)
        trainer = UnslothVisionDataCollatorTrainer()
        state = TrainerState()
        """,
    )
