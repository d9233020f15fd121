"""Every span name and attribute key agl-bridge writes or reads. Nothing else spells them.

Where the OpenTelemetry GenAI semantic conventions have a name, we use it, so our spans read well
in any GenAI-aware backend. What training needs and the conventions lack (episodes, turns, token
ids, rewards, votes, coordination rounds) lives under one namespace of our own, ``agl_bridge.*``.

The converter and the Parquet schema import from here too: renaming an attribute in this file is
the only place a contract change can happen.
"""

from __future__ import annotations

from typing import Final

NAMESPACE: Final = "agl_bridge"
INSTRUMENTATION_SCOPE: Final = "agl_bridge"

# ---------------------------------------------------------------------------------------------
# OpenTelemetry GenAI semantic conventions (development status; names as of semconv 1.37+)
# ---------------------------------------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_WORKFLOW_NAME: Final = "gen_ai.workflow.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"  # JSON; content: messages level only
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"  # content
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"  # content
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"  # JSON; content: messages level only
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"  # JSON; content: messages level only
# Evaluations (scores after the fact): the event gen_ai.evaluation.result, as an OpenTelemetry
# log record or a span event, parented to the evaluated span or carrying gen_ai.response.id
GEN_AI_EVALUATION_RESULT: Final = "gen_ai.evaluation.result"  # the event's name
GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"  # required: what was evaluated for
GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"  # double
GEN_AI_EVALUATION_SCORE_LABEL: Final = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION: Final = "gen_ai.evaluation.explanation"  # content
# the event name of a log record as SDKs before the LogRecord.event_name field wrote it
EVENT_NAME: Final = "event.name"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# gen_ai.operation.name values
OP_CHAT: Final = "chat"
OP_EXECUTE_TOOL: Final = "execute_tool"
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_INVOKE_WORKFLOW: Final = "invoke_workflow"
PROVIDER_OPENAI: Final = "openai"


def chat_span_name(model: str | None) -> str:
    """GenAI convention: ``chat {gen_ai.request.model}``."""
    return f"{OP_CHAT} {model}" if model else OP_CHAT


def invoke_agent_span_name(agent: str | None) -> str:
    """GenAI convention: ``invoke_agent {gen_ai.agent.name}``."""
    return f"{OP_INVOKE_AGENT} {agent}" if agent else OP_INVOKE_AGENT


def invoke_workflow_span_name(workflow: str | None) -> str:
    """GenAI convention: ``invoke_workflow {gen_ai.workflow.name}``."""
    return f"{OP_INVOKE_WORKFLOW} {workflow}" if workflow else OP_INVOKE_WORKFLOW


def execute_tool_span_name(tool: str) -> str:
    """GenAI convention: ``execute_tool {gen_ai.tool.name}``."""
    return f"{OP_EXECUTE_TOOL} {tool}"


# ---------------------------------------------------------------------------------------------
# Our namespace: what RL training needs that the GenAI conventions do not name
# ---------------------------------------------------------------------------------------------
# Scope: stamped on every span started inside agl_bridge.episode()/agent()/turn()
EPISODE_ID: Final = "agl_bridge.episode.id"  # one rollout of the whole team on one task
TASK_ID: Final = "agl_bridge.task.id"  # the problem; GRPO groups rollouts of the same task
AGENT_ROLE: Final = "agl_bridge.agent.role"  # the agent's name goes in gen_ai.agent.name
TURN_INDEX: Final = "agl_bridge.turn.index"
CANDIDATE_INDEX: Final = "agl_bridge.candidate.index"  # k of K tree-sampled alternatives
# Tree sampling (agl_bridge.branch): on each candidate's `chat` span
BRANCH_SIZE: Final = "agl_bridge.branch.size"  # K: the choices asked for in one request
BRANCH_SCORE: Final = "agl_bridge.branch.score"  # this candidate's turn-level score
BRANCH_CHOSEN: Final = "agl_bridge.branch.chosen"  # whether the episode continued from it

# LLM call payload (on `chat {model}` spans)
PROMPT_TOKEN_IDS: Final = "agl_bridge.llm.prompt_token_ids"
COMPLETION_TOKEN_IDS: Final = "agl_bridge.llm.completion_token_ids"
COMPLETION_LOGPROBS: Final = "agl_bridge.llm.completion_logprobs"
POLICY_VERSION: Final = "agl_bridge.policy.version"  # adapter/policy that produced the sample
POLICY_ALIAS: Final = "agl_bridge.policy.alias"  # what the agent asked for, resolved to a version
# the version of the calling agent's prompt the request carries ("writer@p3"; "writer@p0": the
# agent's own), when a prompt table is set (AGL_BRIDGE_PROMPTS; agl_bridge/prompts.py)
PROMPT_VERSION: Final = "agl_bridge.prompt.version"
# the calling agent's own system prompt as the request carries it (the part the prompt table
# replaces: its own text or the live version's), recorded where a framework builds the system
# message around it (MassGen: its coordination message, the agent's prompt one section of it);
# elsewhere the agent's own prompt is its first system message whole. Content: kept at the
# messages capture level only ("" when the agent has no prompt of its own)
PROMPT_TEXT: Final = "agl_bridge.prompt.text"
SERVER_KIND: Final = "agl_bridge.llm.server"  # "vllm" when the server answered GET /version
TOKEN_IDS_STATUS: Final = "agl_bridge.llm.token_ids"  # recorded | not_requested | missing
LLM_STREAM: Final = "agl_bridge.llm.stream"  # bool: the call was streamed
LLM_TOOL_CALL_NAMES: Final = "agl_bridge.llm.tool_call.names"  # string[]: tools the model called
LLM_TOOL_CALL_IDS: Final = "agl_bridge.llm.tool_call.ids"  # string[]
LLM_TOOL_NAMES: Final = "agl_bridge.llm.tool.names"  # string[]: tools offered in the request

# Rewards (on `agl_bridge.reward` spans)
REWARD_VALUE: Final = "agl_bridge.reward.value"
REWARD_KIND: Final = "agl_bridge.reward.kind"
REWARD_SCOPE: Final = "agl_bridge.reward.scope"
REWARD_NAME: Final = "agl_bridge.reward.name"

REWARD_PART_PREFIX: Final = "agl_bridge.reward.part."  # + part name: one attribute per part

# What an evaluation scores when it is not parented to the evaluated span: "episode:<id>",
# "trace:<32 hex>" or "response:<gen_ai.response.id>" (agl_bridge.feedback writes it)
EVALUATION_TARGET: Final = "agl_bridge.evaluation.target"
TARGET_EPISODE: Final = "episode"
TARGET_TRACE: Final = "trace"
TARGET_RESPONSE: Final = "response"
# A log record (an OpenTelemetry event) kept as a span row: its kind, and its body (content:
# kept at the messages capture level only)
EVENT_SPAN_KIND: Final = "EVENT"
LOG_BODY: Final = "agl_bridge.log.body"
# LLM judges (agl-bridge judge): their scores are evaluations named judge:<rubric name>, kind
# judge, and say which model, rubric (sha256 of its text and scale) and mode gave them
JUDGE_EVALUATION_PREFIX: Final = "judge:"
JUDGE_MODEL: Final = "agl_bridge.judge.model"
JUDGE_RUBRIC_SHA256: Final = "agl_bridge.judge.rubric_sha256"
JUDGE_MODE: Final = "agl_bridge.judge.mode"  # absolute | relative

# The demo service's own request attribute (an application's, as a user's service would set
# one): the kind of an addition, for the key:ATTRIBUTE advantage baseline
DEMO_REQUEST_KIND: Final = "demo.request_kind"
DEMO_QUESTION: Final = "demo.question"  # the request itself ("a + b"): what replay plays again

# Coordination (votes, answers, restarts, rounds) for voting/debating orchestrators
VOTE_VOTER: Final = "agl_bridge.vote.voter"
VOTE_TARGET: Final = "agl_bridge.vote.target"
VOTE_REASON: Final = "agl_bridge.vote.reason"  # content
COORDINATION_ROUND: Final = "agl_bridge.coordination.round"
COORDINATION_AGENT: Final = "agl_bridge.coordination.agent"  # who answered / restarted / won
COORDINATION_REASON: Final = "agl_bridge.coordination.reason"  # why a restart / selection
ANSWER_LABEL: Final = "agl_bridge.answer.label"  # how the orchestrator names an answer
ANSWER_CONTENT: Final = "agl_bridge.answer.content"  # content
VOTE_COUNTS: Final = "agl_bridge.vote.counts"  # JSON {agent: votes} on a final selection
HANDOFF_FROM: Final = "agl_bridge.handoff.from"  # the agent handing over (COORDINATION_AGENT: to)
COORDINATION_STRATEGY: Final = "agl_bridge.coordination.strategy"  # round_robin, selector, ...
COORDINATION_SPEAKERS: Final = "agl_bridge.coordination.speakers"  # string[]: chosen speakers

# DAG workflows (Flow-style orchestrators): a workflow of tasks with dependencies
WORKFLOW_ID: Final = "agl_bridge.workflow.id"
WORKFLOW_TASK_ID: Final = "agl_bridge.workflow.task.id"
WORKFLOW_TASK_DEPENDS_ON: Final = "agl_bridge.workflow.task.depends_on"  # string[]
WORKFLOW_TASK_ATTEMPT: Final = "agl_bridge.workflow.task.attempt"  # 0-based
WORKFLOW_VALIDATION_PASSED: Final = "agl_bridge.workflow.validation.passed"  # bool
# who decided what (on schedule spans): the agent whose plan assigned the task, what it assigned
# it to (an executor or a tool), and what the task needs as the orchestrator judges it (a tool
# or capability name); an executor's capabilities, JSON {assignee: [capability]}, if it has any
WORKFLOW_PLANNER: Final = "agl_bridge.workflow.planner"
WORKFLOW_TASK_ASSIGNEE: Final = "agl_bridge.workflow.task.assignee"
WORKFLOW_TASK_REQUIRES: Final = "agl_bridge.workflow.task.requires"
WORKFLOW_CAPABILITIES: Final = "agl_bridge.workflow.capabilities"
# the plan a planner wrote for a workflow (on its agl_bridge.workflow.plan span): whether it
# passed the orchestrator's checks before running, why not, and its shape
WORKFLOW_PLAN_VALID: Final = "agl_bridge.workflow.plan.valid"  # bool
WORKFLOW_PLAN_PROBLEM: Final = "agl_bridge.workflow.plan.problem"
WORKFLOW_PLAN_NODES: Final = "agl_bridge.workflow.plan.nodes"  # int
WORKFLOW_PLAN_EDGES: Final = "agl_bridge.workflow.plan.edges"  # int
WORKFLOW_PLAN_DEPTH: Final = "agl_bridge.workflow.plan.depth"  # int: longest chain, nodes

# Span names of our own (low cardinality on purpose; ids go in attributes)
SPAN_EPISODE: Final = "agl_bridge.episode"
SPAN_TURN: Final = "agl_bridge.turn"
SPAN_REWARD: Final = "agl_bridge.reward"
SPAN_VOTE: Final = "agl_bridge.coordination.vote"
SPAN_NEW_ANSWER: Final = "agl_bridge.coordination.new_answer"
SPAN_RESTART: Final = "agl_bridge.coordination.restart"
SPAN_FINAL_SELECTION: Final = "agl_bridge.coordination.final_selection"
SPAN_ROUND: Final = "agl_bridge.coordination.round"
SPAN_HANDOFF: Final = "agl_bridge.coordination.handoff"
SPAN_SELECT_SPEAKER: Final = "agl_bridge.coordination.select_speaker"
SPAN_TERMINATION: Final = "agl_bridge.coordination.termination"
SPAN_WORKFLOW: Final = "agl_bridge.workflow"
SPAN_WORKFLOW_PLAN: Final = "agl_bridge.workflow.plan"  # an instant: a planner's plan, checked
# workflow task steps: the span is named after the step
WORKFLOW_STEPS: Final = ("schedule", "execute", "validate", "retry")


def workflow_step_span_name(step: str) -> str:
    return f"agl_bridge.workflow.task.{step}"


def reward_part_attribute(part: str) -> str:
    return REWARD_PART_PREFIX + part


class RewardScope:
    """Who a reward is for. Converters match rewards to transitions by scope."""

    TURN: Final = "turn"
    AGENT: Final = "agent"
    TEAM: Final = "team"
    EPISODE: Final = "episode"
    ALL: Final = (TURN, AGENT, TEAM, EPISODE)


class RewardKind:
    """Where a reward came from; lets training weigh or filter sources."""

    TASK: Final = "task"
    TOOL: Final = "tool"
    VOTE: Final = "vote"
    COORDINATION: Final = "coordination"
    HUMAN: Final = "human"
    JUDGE: Final = "judge"  # an LLM judge's score
    EVALUATION: Final = "evaluation"  # an evaluation tool's gen_ai.evaluation.result
    RECIPE: Final = "recipe"  # derived at conversion from what the spans hold
    ALL: Final = (TASK, TOOL, VOTE, COORDINATION, HUMAN, JUDGE, EVALUATION, RECIPE)


# Values of TOKEN_IDS_STATUS
TOKEN_IDS_RECORDED: Final = "recorded"
TOKEN_IDS_NOT_REQUESTED: Final = "not_requested"
TOKEN_IDS_MISSING: Final = "missing"
TOKEN_IDS_NOT_CAPTURED: Final = "not_captured"  # AGL_BRIDGE_CAPTURE=none

# Keys of the scope dict carried in context, mapped to the attribute they stamp on spans.
SCOPE_ATTRIBUTES: Final = {
    "episode_id": EPISODE_ID,
    "task_id": TASK_ID,
    "agent_name": GEN_AI_AGENT_NAME,
    "agent_role": AGENT_ROLE,
    "turn_index": TURN_INDEX,
    "candidate_index": CANDIDATE_INDEX,
    "policy_version": POLICY_VERSION,
    "coordination_round": COORDINATION_ROUND,
    "workflow_id": WORKFLOW_ID,
    "workflow_task_id": WORKFLOW_TASK_ID,
}


# ---------------------------------------------------------------------------------------------
# Other instrumentors' conventions: read at conversion (``trainer/conversion/foreign.py``),
# never written. Indexed keys are prefixes: ``<prefix>{i}.<field>``.
# ---------------------------------------------------------------------------------------------
# the GenAI events that carry a call's messages: the newest one event per call (as a span event
# or a log record), and the older ``gen_ai.content.*`` pair holding the messages as JSON
GEN_AI_OPERATION_DETAILS: Final = "gen_ai.client.inference.operation.details"
# the system prompt, as parts, when an API takes it apart from the chat history
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
GEN_AI_CONTENT_PROMPT: Final = "gen_ai.content.prompt"
GEN_AI_CONTENT_COMPLETION: Final = "gen_ai.content.completion"
GEN_AI_PROMPT: Final = "gen_ai.prompt"  # on gen_ai.content.prompt; OpenLLMetry's prefix below
GEN_AI_COMPLETION: Final = "gen_ai.completion"

# OpenLLMetry (Traceloop) before it wrote gen_ai.input.messages: one flat key per field
OPENLLMETRY_PROMPT_PREFIX: Final = "gen_ai.prompt."  # {i}.role|content|tool_call_id|tool_calls
OPENLLMETRY_COMPLETION_PREFIX: Final = "gen_ai.completion."  # {i}.role|content|finish_reason
OPENLLMETRY_REQUEST_TYPE: Final = "llm.request.type"  # "chat"
OPENLLMETRY_SPAN_KIND: Final = "traceloop.span.kind"  # "agent" on @agent spans
OPENLLMETRY_ENTITY_NAME: Final = "traceloop.entity.name"  # the agent's name on those

# OpenInference (Arize Phoenix)
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"  # "LLM", "AGENT", ...
OPENINFERENCE_INPUT_PREFIX: Final = "llm.input_messages."  # {i}.message.role|content|...
OPENINFERENCE_OUTPUT_PREFIX: Final = "llm.output_messages."
OPENINFERENCE_MODEL_NAME: Final = "llm.model_name"
OPENINFERENCE_AGENT_NAME: Final = "agent.name"
OPENINFERENCE_OUTPUT_VALUE: Final = "output.value"  # the response as JSON: its finish reason
OPENINFERENCE_SESSION_ID: Final = "session.id"  # a conversation: many traces, one episode
OPENLLMETRY_SESSION_ID: Final = "traceloop.association.properties.session_id"
