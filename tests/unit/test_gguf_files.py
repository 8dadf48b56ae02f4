"""Reading a GGUF file once per load (finetune/model/gguf_files.py), on a small file written here."""

from __future__ import annotations

import threading
import time

import gguf
import numpy as np
import pytest

from finetune.model.gguf_files import read_once


def _write(path):
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_within_read_once_a_file_is_parsed_once_and_reads_as_a_fresh_parse(tmp_path):
    path = _write(tmp_path / "tiny.gguf")
    fresh = gguf.GGUFReader(path)
    with read_once():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(path) is first  # another spelling of the same file
        assert gguf.GGUFReader(tmp_path / "." / "tiny.gguf") is first
        name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is name_map
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not name_map
    assert first.fields.keys() == fresh.fields.keys()
    for key, field in fresh.fields.items():
        assert first.fields[key].contents() == field.contents(), key
    assert [t.name for t in first.tensors] == ["token_embd.weight"]
    assert np.array_equal(first.tensors[0].data, fresh.tensors[0].data)
    assert name_map.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"


def test_read_once_puts_gguf_back_even_when_the_load_fails(tmp_path):
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(ValueError), read_once():
        assert gguf.GGUFReader is not reader_class
        raise ValueError("a load that fails")
    assert gguf.GGUFReader is reader_class and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(_write(tmp_path / "tiny.gguf")) is not gguf.GGUFReader(tmp_path / "tiny.gguf")


def test_loads_in_two_threads_leave_gguf_as_it_was():
    """A second thread's load waits for the first's: had it swapped inside the first and left after it,
    it would put back the first's swapped names, and gguf would keep them."""
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    first_inside, first_leaves, second_leaves = threading.Event(), threading.Event(), threading.Event()

    def load(inside, leaves):
        with read_once():
            if inside:
                inside.set()
            leaves.wait(10)

    first = threading.Thread(target=load, args=(first_inside, first_leaves))
    second = threading.Thread(target=load, args=(None, second_leaves))
    first.start()
    assert first_inside.wait(10)
    second.start()
    time.sleep(0.2)  # the second load reaches read_once while the first is inside
    first_leaves.set()
    first.join(10)
    second_leaves.set()  # the second leaves after the first
    second.join(10)
    assert gguf.GGUFReader is reader_class and gguf.get_tensor_name_map is name_map


def test_a_gguf_file_or_its_folder_alone_as_the_model_says_to_give_both(tmp_path):
    """The .gguf file itself as --model_name_or_path, or its folder without --gguf_file: one line with
    the flags to give, before any data is read (transformers would say the file is not JSON, or that it
    could not build a tokenizer)."""
    from finetune.errors import ConfigError
    from finetune.hub import check_model_source

    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ConfigError) as error:
        check_model_source(str(tmp_path / "model.gguf"))
    assert error.value.fix == f"give --model_name_or_path {tmp_path} --gguf_file model.gguf"
    with pytest.raises(ConfigError) as error:
        check_model_source(str(tmp_path))
    assert error.value.flag == "--gguf_file" and error.value.fix == "give --gguf_file model.gguf"
    check_model_source(str(tmp_path), gguf_file="model.gguf")
