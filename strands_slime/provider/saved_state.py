"""The episode's token state inside Strands' own agent state, so a new model resumes it exactly.

Strands keeps the agent's ``model_state`` wherever it keeps the agent (session managers, snapshots,
checkpoints), so the model writes its episode there under :data:`MODEL_STATE_KEY`: the trajectory one
turn per string (each turn encoded once, when sampled) and the bookkeeping as one JSON string; strings
keep Strands' per-call deep copy of ``model_state`` cheap. What cannot be resumed exactly is refused
(:class:`~strands_slime.errors.TokenStateUnavailable`). When it is written and what is refused:
docs/provider.md, ``persist_tokens`` and "Strands features with TITO".
"""

from __future__ import annotations

import base64
import hashlib
import json
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from strands_slime.errors import TokenStateUnavailable
from strands_slime.provider.trajectory import (
    LOGPROB_TYPECODE,
    TOKEN_ID_TYPECODE,
    TokenTrajectory,
)

MODEL_STATE_KEY = "strands_slime"
"""The key of the episode's state in the agent's ``model_state``."""
FORMAT = 1


def _pack(values: array[Any]) -> str:
    """The values' bytes, little-endian, in base64."""
    if not _LITTLE_ENDIAN:  # pragma: no cover - depends on the machine
        values = array(values.typecode, values)
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def _unpack(text: str, typecode: str) -> array[Any]:
    values = array(typecode)
    values.frombytes(base64.b64decode(text.encode("ascii"), validate=True))
    if not _LITTLE_ENDIAN:  # pragma: no cover - depends on the machine
        values.byteswap()
    return values


_LITTLE_ENDIAN = array("H", [1]).tobytes() == b"\x01\x00"


def encode_turn(trajectory: TokenTrajectory, turn: int) -> str:
    """Turn ``turn`` of ``trajectory`` (its prompt and output segments) as one JSON string."""
    start = trajectory.turn_start(turn)
    end = trajectory.turn_start(turn + 1) if turn + 1 < trajectory.turn_count else None
    segments = trajectory.segment_info[start.segment_count : end.segment_count if end else None]
    encoded = []
    for segment in segments:
        stop = segment.start + segment.length
        ids = _pack(trajectory.token_ids[segment.start : stop])
        if segment.is_output:
            logprobs = _pack(trajectory.logprobs[segment.start : stop])
            encoded.append(["output", ids, logprobs, segment.meta_info])
        else:
            encoded.append(["prompt", ids])
    return json.dumps(encoded, ensure_ascii=False, separators=(",", ":"))


def encode_trajectory(trajectory: TokenTrajectory) -> list[str]:
    """Every turn of ``trajectory`` (:func:`encode_turn`)."""
    return [encode_turn(trajectory, turn) for turn in range(trajectory.turn_count)]


def decode_trajectory(turns: Sequence[str], missing_logprobs: int = 0) -> TokenTrajectory:
    """The trajectory :func:`encode_trajectory` wrote.

    Raises:
        ValueError, TypeError, KeyError: a turn is malformed."""
    trajectory = TokenTrajectory()
    for turn in turns:
        trajectory.begin_turn()
        for segment in json.loads(turn):
            ids = _unpack(segment[1], TOKEN_ID_TYPECODE)
            if segment[0] == "output":
                trajectory.add_output(ids, _unpack(segment[2], LOGPROB_TYPECODE), segment[3])
            elif segment[0] == "prompt":
                trajectory.add_prompt(ids)
            else:
                raise ValueError(f"unknown saved segment kind {segment[0]!r}")
    trajectory.missing_logprobs = missing_logprobs
    trajectory.check()
    return trajectory


def tokenizer_fingerprint(templater: Any) -> str:
    """What the saved ids mean: the vocabulary size, the chat family and the chat template."""
    tokenizer = templater.tokenizer
    try:
        vocabulary = len(tokenizer)
    except TypeError:
        vocabulary = getattr(tokenizer, "vocab_size", 0)
    text = (
        f"{vocabulary}|{templater.family.name}|{templater.chat_template or ''}|{templater.template_kwargs!r}"
    )
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def saved_episode(
    *,
    fingerprint: str,
    turns: Sequence[str] | None,
    closed: Sequence[str],
    bookkeeping: Mapping[str, Any],
    outputs: int,
) -> dict[str, Any]:
    """The ``model_state`` entry for an episode; ``turns`` None: its tokens are not kept."""
    if turns is None:
        return {"format": FORMAT, "tokens": False, "outputs": outputs}
    return {
        "format": FORMAT,
        "tokens": True,
        "tokenizer": fingerprint,
        "turns": tuple(turns),
        "closed": tuple(closed),
        "bookkeeping": json.dumps(bookkeeping, ensure_ascii=False, separators=(",", ":")),
    }


def read_saved_episode(
    saved: Any, fingerprint: str
) -> tuple[TokenTrajectory, list[TokenTrajectory], dict[str, Any]] | None:
    """``(trajectory, closed segments, bookkeeping)`` of a saved episode, or None when it holds no
    model output (nothing to resume).

    Raises:
        TokenStateUnavailable: the state cannot be resumed exactly (the message says why and what to do)."""
    if not isinstance(saved, Mapping) or saved.get("format") != FORMAT:
        raise TokenStateUnavailable(
            f"the agent's model_state[{MODEL_STATE_KEY!r}] is not a format-{FORMAT} strands_slime state "
            "(saved by another version?); call model.reset() to start a new episode from the history as a prompt"
        )
    if not saved.get("tokens"):
        if not saved.get("outputs"):
            return None
        raise TokenStateUnavailable(
            f"the agent's history holds {saved['outputs']} output(s) an SGLangModel sampled, but their token "
            "ids were not saved with it (the model keeps them in model_state with a session manager, or "
            "with persist_tokens=True): a new model could only re-tokenize their text. Pass "
            "persist_tokens=True where the agent's state is saved otherwise (agent.take_snapshot()), or "
            "call model.reset() to train on the restored history as a prompt"
        )
    if saved.get("tokenizer") != fingerprint:
        raise TokenStateUnavailable(
            "the agent's saved token state was written with another tokenizer or chat template; its ids "
            "mean something else here. Resume with the same tokenizer and chat options, or call "
            "model.reset() to start a new episode from the history as a prompt"
        )
    try:
        bookkeeping = json.loads(saved["bookkeeping"])
        trajectory = decode_trajectory(saved["turns"], int(bookkeeping["missing_logprobs"]))
        closed = [
            decode_trajectory(json.loads(segment["turns"]), int(segment["missing_logprobs"]))
            for segment in map(json.loads, saved.get("closed") or ())
        ]
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise TokenStateUnavailable(
            f"the agent's saved token state is damaged ({type(exc).__name__}: {exc}); call model.reset() "
            "to start a new episode from the history as a prompt"
        ) from exc
    return trajectory, closed, bookkeeping


def encode_closed(trajectory: TokenTrajectory) -> str:
    """A closed context segment (``new_segment_on_context_change``) as one string, encoded once."""
    return json.dumps(
        {"turns": json.dumps(encode_trajectory(trajectory)), "missing_logprobs": trajectory.missing_logprobs}
    )


class SavedEpisode:
    """A model's side of the agent's ``model_state``: it writes the episode there after each call and
    follows an episode it did not write (a session, checkpoint or snapshot restored into a new model).
    The check is one identity test per call (Strands' deep copy keeps the strings)."""

    __slots__ = ("_fingerprint", "adopt", "bookkeeping", "chunked", "closed_chunks", "fresh", "turn_chunks")

    def __init__(self, adopt: bool) -> None:
        self.fresh = adopt
        """No call yet: a saved episode the agent holds but this model cannot resume is refused."""
        self.adopt = adopt
        """Whether a saved episode that is not the one this model wrote last is followed. Off from
        ``reset`` (a new episode) until the model's first save."""
        self.bookkeeping: str | None = None
        """The bookkeeping string of the entry this model wrote or resumed last."""
        self.turn_chunks: list[str] = []
        self.chunked: TokenTrajectory | None = None
        """The trajectory :attr:`turn_chunks` encode (each turn is encoded once)."""
        self.closed_chunks: list[str] = []
        self._fingerprint: tuple[Any, str] | None = None

    def fingerprint(self, templater: Any) -> str:
        """What the saved ids mean for ``templater`` (cached per templater)."""
        cached = self._fingerprint
        if cached is None or cached[0] is not templater:
            cached = self._fingerprint = (templater, tokenizer_fingerprint(templater))
        return cached[1]

    def follow(self, model: Any, model_state: Any) -> None:
        """Go on with the episode ``model_state`` holds when it is not the one ``model`` wrote last;
        what cannot be resumed exactly is refused loudly (:class:`TokenStateUnavailable`)."""
        saved = model_state.get(MODEL_STATE_KEY) if isinstance(model_state, Mapping) else None
        if saved is None or not self.adopt:
            return
        if not isinstance(saved, Mapping) or not saved.get("tokens"):
            if self.fresh:  # a new model cannot go on with outputs whose ids were not saved
                read_saved_episode(saved, self.fingerprint(model.templater))
            return
        bookkeeping = saved.get("bookkeeping")
        if bookkeeping is self.bookkeeping or bookkeeping == self.bookkeeping:
            self.bookkeeping = bookkeeping
            return
        restored = read_saved_episode(saved, self.fingerprint(model.templater))
        if restored is None:
            return
        trajectory, closed, state = restored
        agent = model.history.agent
        try:
            model.from_state(state["model"], trajectory, closed)
        except (KeyError, TypeError, ValueError) as exc:
            raise TokenStateUnavailable(
                f"the agent's saved episode state is damaged ({type(exc).__name__}: {exc}); call "
                "model.reset() to start a new episode from the history as a prompt"
            ) from exc
        model.history.agent = agent
        keeper = model.saved
        keeper.adopt, keeper.bookkeeping = True, bookkeeping
        keeper.turn_chunks, keeper.chunked = list(saved["turns"]), trajectory
        keeper.closed_chunks = list(saved.get("closed") or ())

    def save(self, model: Any, model_state: Any, agent_metadata: Any) -> None:
        """Write the episode into ``model_state`` (Strands keeps it after a successful call): the turns
        not yet encoded and the bookkeeping; or, without ``persist_tokens`` (by default: no session
        manager, so nothing keeps the agent), only a marker saying the outputs' ids are not kept."""
        if not isinstance(model_state, dict):
            return
        lane = model.lane
        outputs = model.recorded_outputs + sum(t.num_outputs for t in lane.closed)
        keep = model.wiring.persist_tokens
        if keep is None:  # Strands sets the session id only when a session manager is attached
            keep = getattr(agent_metadata, "session_id", None) is not None
        if not keep:
            model_state[MODEL_STATE_KEY] = saved_episode(
                fingerprint="", turns=None, closed=(), bookkeeping={}, outputs=outputs
            )
            return
        for closed in lane.closed[len(self.closed_chunks) :]:
            self.closed_chunks.append(encode_closed(closed))
        trajectory = lane.trajectory
        if self.chunked is not trajectory:  # a new segment or a restored trajectory: encode anew
            self.turn_chunks, self.chunked = [], trajectory
        del self.turn_chunks[trajectory.turn_count :]
        for turn in range(len(self.turn_chunks), trajectory.turn_count):
            self.turn_chunks.append(encode_turn(trajectory, turn))
        entry = saved_episode(
            fingerprint=self.fingerprint(model.templater),
            turns=self.turn_chunks,
            closed=self.closed_chunks,
            bookkeeping={"model": model.state(), "missing_logprobs": trajectory.missing_logprobs},
            outputs=outputs,
        )
        model_state[MODEL_STATE_KEY] = entry
        self.bookkeeping, self.adopt = entry["bookkeeping"], True
