"""The wire messages of the split runtime, as protobuf classes built at import time from a
descriptor written in Python (the same schema as ``split.proto`` beside this file; no protoc or
generated ``*_pb2.py``: to change the protocol, edit both ``split.proto`` and ``_FIELDS`` here).

Only token ids and a few scalars travel: no attention masks, no draft probabilities (the server's
sample-and-match rule needs none, see :mod:`.acceptance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from runtime.split.verifier import VerifyRequest

if TYPE_CHECKING:
    from google.protobuf.message import Message

PACKAGE = "specsched.split"
SERVICE = f"{PACKAGE}.Verifier"
METHOD = f"/{SERVICE}/Verify"

_F = descriptor_pb2.FieldDescriptorProto
_FIELDS = {
    "VerifyMsg": [("seq", _F.TYPE_UINT32, False), ("prompt", _F.TYPE_INT32, True), ("drafts", _F.TYPE_INT32, True),
                  ("committed", _F.TYPE_INT32, False), ("temperature", _F.TYPE_FLOAT, False), ("seed", _F.TYPE_UINT64, False),
                  ("release", _F.TYPE_BOOL, False), ("sent_at", _F.TYPE_DOUBLE, False)],
    "VerdictMsg": [("seq", _F.TYPE_UINT32, False), ("accepted", _F.TYPE_INT32, False), ("bonus", _F.TYPE_INT32, False),
                   ("committed", _F.TYPE_INT32, False), ("arrived_at", _F.TYPE_DOUBLE, False), ("queue_wait_ms", _F.TYPE_DOUBLE, False),
                   ("compute_ms", _F.TYPE_DOUBLE, False), ("batch_size", _F.TYPE_INT32, False), ("cohort", _F.TYPE_INT32, False),
                   ("prompts", _F.TYPE_INT32, False)],
}


def build_messages(file_name: str, package: str, fields: dict[str, list[tuple[str, int, bool]]]) -> tuple:
    """Message classes for ``fields`` (name -> [(field, proto type, repeated)], numbered in order),
    built at import from a descriptor, so no generated ``_pb2`` module or protoc step is needed."""
    fd = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
    for name, msg_fields in fields.items():
        msg = fd.message_type.add(name=name)
        for number, (fname, ftype, repeated) in enumerate(msg_fields, start=1):
            msg.field.add(name=fname, number=number, type=ftype, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{n}")) for n in fields)


VerifyMsg, VerdictMsg = build_messages("specsched_split.proto", PACKAGE, _FIELDS)


@dataclass(frozen=True)
class Reply:
    """A verdict with the server's timings (what a link's future resolves to)."""

    accepted: int
    bonus: int
    committed: int
    arrived_at: float  #: server wall clock, s
    queue_wait_ms: float
    compute_ms: float
    batch_size: int
    cohort: int = 0
    prompts: int = 0  #: rows of the batch that began a request (their prompt's prefill is in ``compute_ms``)


def request_to_msg(req: VerifyRequest, seq: int, sent_at: float) -> Message:
    return VerifyMsg(seq=seq, prompt=list(req.prompt), drafts=list(req.drafts), committed=req.committed,
                     temperature=req.temperature, seed=req.seed, sent_at=sent_at)


def msg_to_request(msg: Message, client: str) -> VerifyRequest:
    return VerifyRequest(client, tuple(msg.drafts), tuple(msg.prompt), int(msg.committed), float(msg.temperature), int(msg.seed))


def reply_to_msg(reply: Reply, seq: int) -> Message:
    return VerdictMsg(seq=seq, **{k: getattr(reply, k) for k in Reply.__dataclass_fields__})


def msg_to_reply(msg: Message) -> Reply:
    return Reply(**{k: getattr(msg, k) for k in Reply.__dataclass_fields__})
