"""CudaClock's marks land on the stream in force (issue 42): the clock keeps the current stream's object between marks
(torch.cuda.current_stream() cost half a mark's host time on an H200) and takes it again when the device or its
current stream changes. torch's CUDA calls are stood in for by a fake device here (this machine has no GPU);
scripts/gpu_check.sh runs the real clock's spans on a GPU."""

from __future__ import annotations

import types

import pytest

from ddptop.probes.clock import CudaClock


class FakeCuda:
    """A device whose current stream is a handle the test sets; current_stream() builds a fresh object each call,
    as torch's does, and counts its calls."""

    def __init__(self):
        self.device, self.raw, self.built = 0, 1000, 0
        self.recorded: list = []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing

            def record(self, stream=None):
                fake.recorded.append(stream if stream is not None else fake.current_stream(None))

        self.Event = Event

    def current_stream(self, index):
        self.built += 1
        return ("stream", self.device if index is None else index, self.raw)


@pytest.fixture
def clock():
    cuda = FakeCuda()
    clock = CudaClock()
    clock._torch = types.SimpleNamespace(cuda=cuda)
    clock._event = cuda.Event
    clock._device = lambda: cuda.device
    clock._raw = lambda index: cuda.raw + 100 * index
    return clock, cuda


def test_marks_reuse_the_stream_until_the_current_stream_or_device_changes(clock):
    clock, cuda = clock
    for _ in range(5):
        clock.now()
    assert cuda.built == 1 and cuda.recorded == [("stream", 0, 1000)] * 5
    cuda.raw = 2000  # a user's `with torch.cuda.stream(s):`
    clock.now()
    cuda.device = 1  # torch.cuda.set_device(1)
    clock.now()
    cuda.raw = 1000  # back to the first stream
    cuda.device = 0
    clock.now()
    assert cuda.built == 4
    assert cuda.recorded[5:] == [("stream", 0, 2000), ("stream", 1, 2000), ("stream", 0, 1000)]


def test_without_the_c_calls_the_event_finds_its_stream_itself(clock):
    clock, cuda = clock
    clock._device = clock._raw = None  # a torch without them
    clock.now()
    clock.now()
    assert cuda.recorded == [("stream", 0, 1000)] * 2 and cuda.built == 2
