"""The two on-disk contracts: span rows (capture -> Parquet) and transitions (converter -> trainer).

Span rows keep every attribute. The ones training reads are promoted to typed columns (token ids
as ``list<int32>``, the turn as ``int32``, ...) so a scan never parses JSON; all other attributes
go to the ``attributes`` JSON column. A promoted attribute whose value does not fit its column
type (a turn sent as ``"3"``) stays in the JSON and its column is null: nothing is lost or coerced.
"""

from __future__ import annotations

import pyarrow as pa

from agl_bridge import semconv as sc

# 2: coordination_round promoted; 3: no nulls inside id and logprob lists; 4: response id and
# evaluations (name, score, target) promoted. Files of every earlier version read as before.
SPAN_SCHEMA_VERSION = 4
TRANSITION_SCHEMA_VERSION = 3  # 3: no nulls inside its lists


def values_list(value_type: pa.DataType) -> pa.DataType:
    """A list whose values are never null (token ids, logprobs, masks; the list itself may be).

    Declared so because Parquet then stores one level fewer per value and readers build no
    validity bitmap (figures: benchmarks/README_convert.md). Promotion (``otel.rows``) only
    ever puts whole lists of numbers here; a list with a None stays in the attributes JSON.
    """
    return pa.list_(pa.field("element", value_type, nullable=False))


# attribute key -> (column name, arrow type) for attributes promoted to their own column
PROMOTED_ATTRIBUTES: dict[str, tuple[str, pa.DataType]] = {
    sc.EPISODE_ID: ("episode_id", pa.string()),
    sc.TASK_ID: ("task_id", pa.string()),
    sc.GEN_AI_AGENT_NAME: ("agent_name", pa.string()),
    sc.AGENT_ROLE: ("agent_role", pa.string()),
    sc.TURN_INDEX: ("turn_index", pa.int32()),
    sc.CANDIDATE_INDEX: ("candidate_index", pa.int32()),
    sc.COORDINATION_ROUND: ("coordination_round", pa.int32()),
    sc.GEN_AI_OPERATION_NAME: ("operation_name", pa.string()),
    sc.GEN_AI_REQUEST_MODEL: ("request_model", pa.string()),
    sc.POLICY_VERSION: ("policy_version", pa.string()),
    sc.PROMPT_TOKEN_IDS: ("prompt_token_ids", values_list(pa.int32())),
    sc.COMPLETION_TOKEN_IDS: ("completion_token_ids", values_list(pa.int32())),
    sc.COMPLETION_LOGPROBS: ("completion_logprobs", values_list(pa.float64())),
    sc.REWARD_VALUE: ("reward_value", pa.float64()),
    sc.REWARD_KIND: ("reward_kind", pa.string()),
    sc.REWARD_SCOPE: ("reward_scope", pa.string()),
    sc.GEN_AI_RESPONSE_ID: ("response_id", pa.string()),
    sc.GEN_AI_EVALUATION_NAME: ("evaluation_name", pa.string()),
    sc.GEN_AI_EVALUATION_SCORE_VALUE: ("evaluation_score", pa.float64()),
    sc.GEN_AI_EVALUATION_SCORE_LABEL: ("evaluation_label", pa.string()),
    sc.EVALUATION_TARGET: ("evaluation_target", pa.string()),
}

SPAN_SCHEMA = pa.schema(
    [
        pa.field("trace_id", pa.string(), nullable=False),  # 32 hex digits, as in OTLP/JSON
        pa.field("span_id", pa.string(), nullable=False),  # 16 hex digits
        pa.field("parent_span_id", pa.string()),  # null for a root span
        pa.field("name", pa.string(), nullable=False),
        pa.field("kind", pa.string()),  # INTERNAL, CLIENT, ...
        pa.field("start_time_unix_nano", pa.int64()),  # as in OTLP; exact, no datetime needed
        pa.field("end_time_unix_nano", pa.int64()),
        pa.field("status_code", pa.string()),  # UNSET, OK, ERROR
        pa.field("status_message", pa.string()),
        pa.field("service_name", pa.string()),
        pa.field("scope_name", pa.string()),  # instrumentation scope
        *[pa.field(col, typ) for col, typ in PROMOTED_ATTRIBUTES.values()],
        pa.field("attributes", pa.string()),  # JSON object: every attribute not promoted
        pa.field("events", pa.string()),  # JSON list of {name, time_unix_nano, attributes}
        pa.field("links", pa.string()),  # JSON list of {trace_id, span_id, attributes}
        pa.field("resource", pa.string()),  # JSON object of resource attributes
    ],
    metadata={"agl_bridge.schema": "spans", "agl_bridge.schema_version": str(SPAN_SCHEMA_VERSION)},
)

TRANSITION_SCHEMA = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("agent_name", pa.string()),
        pa.field("turn_index", pa.int32()),
        pa.field("candidate_index", pa.int32()),
        pa.field("trace_id", pa.string()),
        pa.field("span_id", pa.string()),  # the (first) LLM span this transition came from
        pa.field("merged_calls", pa.int32(), nullable=False),  # LLM calls merged into it
        pa.field("request_model", pa.string()),
        pa.field("policy_version", pa.string()),  # behaviour policy that sampled the completion
        pa.field("prompt_ids", values_list(pa.int32()), nullable=False),
        pa.field("completion_ids", values_list(pa.int32()), nullable=False),
        # 1 where the completion token is trained on, 0 where it is context: the observation
        # tokens between merged calls of one turn; same length as completion_ids
        pa.field("completion_mask", values_list(pa.int8()), nullable=False),
        # sampler's logprobs of completion_ids (0.0 at masked positions); null if the server
        # sent none
        pa.field("behaviour_logprobs", values_list(pa.float32())),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),  # transitions compared with each other
        pa.field("advantage", pa.float64()),  # group-relative, as configured at conversion
        pa.field("retokenized", pa.bool_(), nullable=False),  # ids rebuilt from text, not served
        pa.field("start_time_unix_nano", pa.int64()),
    ],
    metadata={
        "agl_bridge.schema": "transitions",
        "agl_bridge.schema_version": str(TRANSITION_SCHEMA_VERSION),
    },
)

# Columns the converter cannot work without: a file lacking one is refused by name.
REQUIRED_SPAN_COLUMNS = (
    "trace_id",
    "span_id",
    "name",
    "start_time_unix_nano",
    "episode_id",
    "operation_name",
    "prompt_token_ids",
    "completion_token_ids",
    "reward_value",
)
REQUIRED_TRANSITION_COLUMNS = tuple(f.name for f in TRANSITION_SCHEMA if not f.nullable) + (
    "behaviour_logprobs",
)
