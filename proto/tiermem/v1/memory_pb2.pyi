import datetime

from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_FAST: _ClassVar[Tier]
    TIER_MEDIUM: _ClassVar[Tier]
    TIER_SLOW: _ClassVar[Tier]
    TIER_GLACIAL: _ClassVar[Tier]

class SearchStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_STRATEGY_UNSPECIFIED: _ClassVar[SearchStrategy]
    SEARCH_STRATEGY_COMPREHENSIVE: _ClassVar[SearchStrategy]
    SEARCH_STRATEGY_WEIGHTED: _ClassVar[SearchStrategy]
    SEARCH_STRATEGY_FAST_FIRST: _ClassVar[SearchStrategy]
    SEARCH_STRATEGY_SIMILARITY: _ClassVar[SearchStrategy]
    SEARCH_STRATEGY_RECENCY: _ClassVar[SearchStrategy]
    SEARCH_STRATEGY_IMPORTANCE: _ClassVar[SearchStrategy]
    SEARCH_STRATEGY_FUSED: _ClassVar[SearchStrategy]

class ScopeRouting(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_ROUTING_UNSPECIFIED: _ClassVar[ScopeRouting]
    SCOPE_ROUTING_FENCED: _ClassVar[ScopeRouting]
    SCOPE_ROUTING_MOVED: _ClassVar[ScopeRouting]
    SCOPE_ROUTING_RECEIVING: _ClassVar[ScopeRouting]

class RetentionPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETENTION_POLICY_UNSPECIFIED: _ClassVar[RetentionPolicy]
    RETENTION_POLICY_IMPORTANCE_WEIGHTED: _ClassVar[RetentionPolicy]
    RETENTION_POLICY_RECENCY: _ClassVar[RetentionPolicy]
    RETENTION_POLICY_FIFO: _ClassVar[RetentionPolicy]
    RETENTION_POLICY_LRU: _ClassVar[RetentionPolicy]
    RETENTION_POLICY_IMPORTANCE: _ClassVar[RetentionPolicy]
    RETENTION_POLICY_TEN_POINT_WEIGHTED: _ClassVar[RetentionPolicy]

class ImportanceDecay(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMPORTANCE_DECAY_UNSPECIFIED: _ClassVar[ImportanceDecay]
    IMPORTANCE_DECAY_HALF_LIFE: _ClassVar[ImportanceDecay]
    IMPORTANCE_DECAY_NONE: _ClassVar[ImportanceDecay]

class ImportanceHeuristic(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMPORTANCE_HEURISTIC_UNSPECIFIED: _ClassVar[ImportanceHeuristic]
    IMPORTANCE_HEURISTIC_CUES: _ClassVar[ImportanceHeuristic]
    IMPORTANCE_HEURISTIC_TEN_POINT: _ClassVar[ImportanceHeuristic]
    IMPORTANCE_HEURISTIC_PHRASES: _ClassVar[ImportanceHeuristic]

class RecencyBasis(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECENCY_BASIS_UNSPECIFIED: _ClassVar[RecencyBasis]
    RECENCY_BASIS_CREATION: _ClassVar[RecencyBasis]
    RECENCY_BASIS_LAST_ACCESS: _ClassVar[RecencyBasis]

class SummaryStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUMMARY_STRATEGY_UNSPECIFIED: _ClassVar[SummaryStrategy]
    SUMMARY_STRATEGY_ROLLING: _ClassVar[SummaryStrategy]
    SUMMARY_STRATEGY_HIERARCHICAL: _ClassVar[SummaryStrategy]

class MoveReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MOVE_REASON_UNSPECIFIED: _ClassVar[MoveReason]
    MOVE_REASON_PROMOTE_ACCESS: _ClassVar[MoveReason]
    MOVE_REASON_PROMOTE_SURPRISE: _ClassVar[MoveReason]
    MOVE_REASON_PROMOTE_SUCCESS: _ClassVar[MoveReason]
    MOVE_REASON_DEMOTE_IDLE: _ClassVar[MoveReason]
    MOVE_REASON_DEMOTE_DECAY: _ClassVar[MoveReason]
    MOVE_REASON_EVICT_CAPACITY: _ClassVar[MoveReason]
    MOVE_REASON_DELETE_CAPACITY: _ClassVar[MoveReason]
    MOVE_REASON_EXPIRED: _ClassVar[MoveReason]
    MOVE_REASON_FLUSH_WORKING: _ClassVar[MoveReason]

class TransferMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSFER_MODE_UNSPECIFIED: _ClassVar[TransferMode]
    TRANSFER_MODE_COPY: _ClassVar[TransferMode]
    TRANSFER_MODE_MOVE: _ClassVar[TransferMode]
TIER_UNSPECIFIED: Tier
TIER_FAST: Tier
TIER_MEDIUM: Tier
TIER_SLOW: Tier
TIER_GLACIAL: Tier
SEARCH_STRATEGY_UNSPECIFIED: SearchStrategy
SEARCH_STRATEGY_COMPREHENSIVE: SearchStrategy
SEARCH_STRATEGY_WEIGHTED: SearchStrategy
SEARCH_STRATEGY_FAST_FIRST: SearchStrategy
SEARCH_STRATEGY_SIMILARITY: SearchStrategy
SEARCH_STRATEGY_RECENCY: SearchStrategy
SEARCH_STRATEGY_IMPORTANCE: SearchStrategy
SEARCH_STRATEGY_FUSED: SearchStrategy
SCOPE_ROUTING_UNSPECIFIED: ScopeRouting
SCOPE_ROUTING_FENCED: ScopeRouting
SCOPE_ROUTING_MOVED: ScopeRouting
SCOPE_ROUTING_RECEIVING: ScopeRouting
RETENTION_POLICY_UNSPECIFIED: RetentionPolicy
RETENTION_POLICY_IMPORTANCE_WEIGHTED: RetentionPolicy
RETENTION_POLICY_RECENCY: RetentionPolicy
RETENTION_POLICY_FIFO: RetentionPolicy
RETENTION_POLICY_LRU: RetentionPolicy
RETENTION_POLICY_IMPORTANCE: RetentionPolicy
RETENTION_POLICY_TEN_POINT_WEIGHTED: RetentionPolicy
IMPORTANCE_DECAY_UNSPECIFIED: ImportanceDecay
IMPORTANCE_DECAY_HALF_LIFE: ImportanceDecay
IMPORTANCE_DECAY_NONE: ImportanceDecay
IMPORTANCE_HEURISTIC_UNSPECIFIED: ImportanceHeuristic
IMPORTANCE_HEURISTIC_CUES: ImportanceHeuristic
IMPORTANCE_HEURISTIC_TEN_POINT: ImportanceHeuristic
IMPORTANCE_HEURISTIC_PHRASES: ImportanceHeuristic
RECENCY_BASIS_UNSPECIFIED: RecencyBasis
RECENCY_BASIS_CREATION: RecencyBasis
RECENCY_BASIS_LAST_ACCESS: RecencyBasis
SUMMARY_STRATEGY_UNSPECIFIED: SummaryStrategy
SUMMARY_STRATEGY_ROLLING: SummaryStrategy
SUMMARY_STRATEGY_HIERARCHICAL: SummaryStrategy
MOVE_REASON_UNSPECIFIED: MoveReason
MOVE_REASON_PROMOTE_ACCESS: MoveReason
MOVE_REASON_PROMOTE_SURPRISE: MoveReason
MOVE_REASON_PROMOTE_SUCCESS: MoveReason
MOVE_REASON_DEMOTE_IDLE: MoveReason
MOVE_REASON_DEMOTE_DECAY: MoveReason
MOVE_REASON_EVICT_CAPACITY: MoveReason
MOVE_REASON_DELETE_CAPACITY: MoveReason
MOVE_REASON_EXPIRED: MoveReason
MOVE_REASON_FLUSH_WORKING: MoveReason
TRANSFER_MODE_UNSPECIFIED: TransferMode
TRANSFER_MODE_COPY: TransferMode
TRANSFER_MODE_MOVE: TransferMode

class Value(_message.Message):
    __slots__ = ("string_value", "int_value", "double_value", "bool_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    int_value: int
    double_value: float
    bool_value: bool
    def __init__(self, string_value: _Optional[str] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., bool_value: _Optional[bool] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("id", "namespace", "content", "kind", "tier", "importance", "source", "topic", "tags", "metadata", "embedding", "embedding_model", "create_time", "update_time", "last_access_time", "access_count", "surprise_score", "success_count", "token_cost", "source_memory_ids", "expire_time", "tier_time", "origin", "questions")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCESS_TIME_FIELD_NUMBER: _ClassVar[int]
    ACCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    SURPRISE_SCORE_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COST_FIELD_NUMBER: _ClassVar[int]
    SOURCE_MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    TIER_TIME_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    content: str
    kind: str
    tier: Tier
    importance: float
    source: str
    topic: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.MessageMap[str, Value]
    embedding: _containers.RepeatedScalarFieldContainer[float]
    embedding_model: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    last_access_time: _timestamp_pb2.Timestamp
    access_count: int
    surprise_score: float
    success_count: int
    token_cost: int
    source_memory_ids: _containers.RepeatedScalarFieldContainer[str]
    expire_time: _timestamp_pb2.Timestamp
    tier_time: _timestamp_pb2.Timestamp
    origin: MemoryOrigin
    questions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., namespace: _Optional[str] = ..., content: _Optional[str] = ..., kind: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., importance: _Optional[float] = ..., source: _Optional[str] = ..., topic: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Mapping[str, Value]] = ..., embedding: _Optional[_Iterable[float]] = ..., embedding_model: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_access_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., access_count: _Optional[int] = ..., surprise_score: _Optional[float] = ..., success_count: _Optional[int] = ..., token_cost: _Optional[int] = ..., source_memory_ids: _Optional[_Iterable[str]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tier_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., origin: _Optional[_Union[MemoryOrigin, _Mapping]] = ..., questions: _Optional[_Iterable[str]] = ...) -> None: ...

class MemoryOrigin(_message.Message):
    __slots__ = ("namespace", "id", "tier", "transfer_time")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_TIME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    tier: Tier
    transfer_time: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., transfer_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateMemoryRequest(_message.Message):
    __slots__ = ("memory", "request_id", "dedup_similarity", "allow_duplicates", "confirm")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUP_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    ALLOW_DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    request_id: str
    dedup_similarity: float
    allow_duplicates: bool
    confirm: bool
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., request_id: _Optional[str] = ..., dedup_similarity: _Optional[float] = ..., allow_duplicates: _Optional[bool] = ..., confirm: _Optional[bool] = ...) -> None: ...

class CreateMemoryResponse(_message.Message):
    __slots__ = ("memory", "deduplicated", "reflection_due", "summary_due", "embedding_pending")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    REFLECTION_DUE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_DUE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_PENDING_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    deduplicated: bool
    reflection_due: bool
    summary_due: bool
    embedding_pending: bool
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., deduplicated: _Optional[bool] = ..., reflection_due: _Optional[bool] = ..., summary_due: _Optional[bool] = ..., embedding_pending: _Optional[bool] = ...) -> None: ...

class BatchCreateMemoriesRequest(_message.Message):
    __slots__ = ("memories", "request_id", "dedup_similarity", "allow_duplicates", "confirm")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUP_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    ALLOW_DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    request_id: str
    dedup_similarity: float
    allow_duplicates: bool
    confirm: bool
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., request_id: _Optional[str] = ..., dedup_similarity: _Optional[float] = ..., allow_duplicates: _Optional[bool] = ..., confirm: _Optional[bool] = ...) -> None: ...

class BatchCreateMemoriesResponse(_message.Message):
    __slots__ = ("memories", "deduplicated", "reflection_due_namespaces", "summary_due_namespaces", "embedding_pending")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    REFLECTION_DUE_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_DUE_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_PENDING_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    deduplicated: _containers.RepeatedScalarFieldContainer[bool]
    reflection_due_namespaces: _containers.RepeatedScalarFieldContainer[str]
    summary_due_namespaces: _containers.RepeatedScalarFieldContainer[str]
    embedding_pending: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., deduplicated: _Optional[_Iterable[bool]] = ..., reflection_due_namespaces: _Optional[_Iterable[str]] = ..., summary_due_namespaces: _Optional[_Iterable[str]] = ..., embedding_pending: _Optional[_Iterable[bool]] = ...) -> None: ...

class GetMemoryRequest(_message.Message):
    __slots__ = ("namespace", "id", "include_embedding")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    include_embedding: bool
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., include_embedding: _Optional[bool] = ...) -> None: ...

class GetMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ...) -> None: ...

class UpdateMemoryRequest(_message.Message):
    __slots__ = ("memory", "update_mask", "confirm")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    update_mask: _field_mask_pb2.FieldMask
    confirm: bool
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., confirm: _Optional[bool] = ...) -> None: ...

class UpdateMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ...) -> None: ...

class DeleteMemoryRequest(_message.Message):
    __slots__ = ("namespace", "id", "confirm")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    confirm: bool
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., confirm: _Optional[bool] = ...) -> None: ...

class DeleteMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemoryFilter(_message.Message):
    __slots__ = ("tiers", "kinds", "tags_any", "tags_all", "source", "topic", "created_after", "created_before", "where")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    TAGS_ANY_FIELD_NUMBER: _ClassVar[int]
    TAGS_ALL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedScalarFieldContainer[Tier]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    tags_any: _containers.RepeatedScalarFieldContainer[str]
    tags_all: _containers.RepeatedScalarFieldContainer[str]
    source: str
    topic: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    where: str
    def __init__(self, tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., kinds: _Optional[_Iterable[str]] = ..., tags_any: _Optional[_Iterable[str]] = ..., tags_all: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ..., topic: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., where: _Optional[str] = ...) -> None: ...

class ListMemoriesRequest(_message.Message):
    __slots__ = ("namespace", "page_size", "page_token", "filter", "include_embedding", "newest_first")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    filter: MemoryFilter
    include_embedding: bool
    newest_first: bool
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[_Union[MemoryFilter, _Mapping]] = ..., include_embedding: _Optional[bool] = ..., newest_first: _Optional[bool] = ...) -> None: ...

class ListMemoriesResponse(_message.Message):
    __slots__ = ("memories", "next_page_token")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    next_page_token: str
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SearchMemoriesRequest(_message.Message):
    __slots__ = ("namespaces", "query_embedding", "embedding_model", "query_text", "filter", "limit", "min_similarity", "alpha", "beta", "gamma", "recency_tau_seconds", "as_of", "include_embedding", "strategy", "tier_weights", "include_ancestors", "scope_weights", "explain", "read_only", "hybrid")
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    QUERY_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    QUERY_TEXT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIN_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    RECENCY_TAU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TIER_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ANCESTORS_FIELD_NUMBER: _ClassVar[int]
    SCOPE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    HYBRID_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    query_embedding: _containers.RepeatedScalarFieldContainer[float]
    embedding_model: str
    query_text: str
    filter: MemoryFilter
    limit: int
    min_similarity: float
    alpha: float
    beta: float
    gamma: float
    recency_tau_seconds: float
    as_of: _timestamp_pb2.Timestamp
    include_embedding: bool
    strategy: SearchStrategy
    tier_weights: _containers.RepeatedCompositeFieldContainer[TierWeight]
    include_ancestors: bool
    scope_weights: _containers.RepeatedScalarFieldContainer[float]
    explain: bool
    read_only: bool
    hybrid: HybridOptions
    def __init__(self, namespaces: _Optional[_Iterable[str]] = ..., query_embedding: _Optional[_Iterable[float]] = ..., embedding_model: _Optional[str] = ..., query_text: _Optional[str] = ..., filter: _Optional[_Union[MemoryFilter, _Mapping]] = ..., limit: _Optional[int] = ..., min_similarity: _Optional[float] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., gamma: _Optional[float] = ..., recency_tau_seconds: _Optional[float] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., include_embedding: _Optional[bool] = ..., strategy: _Optional[_Union[SearchStrategy, str]] = ..., tier_weights: _Optional[_Iterable[_Union[TierWeight, _Mapping]]] = ..., include_ancestors: _Optional[bool] = ..., scope_weights: _Optional[_Iterable[float]] = ..., explain: _Optional[bool] = ..., read_only: _Optional[bool] = ..., hybrid: _Optional[_Union[HybridOptions, _Mapping]] = ...) -> None: ...

class HybridOptions(_message.Message):
    __slots__ = ("enabled", "rrf_k", "vector_weight", "keyword_weight")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    RRF_K_FIELD_NUMBER: _ClassVar[int]
    VECTOR_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    rrf_k: float
    vector_weight: float
    keyword_weight: float
    def __init__(self, enabled: _Optional[bool] = ..., rrf_k: _Optional[float] = ..., vector_weight: _Optional[float] = ..., keyword_weight: _Optional[float] = ...) -> None: ...

class TierWeight(_message.Message):
    __slots__ = ("tier", "weight")
    TIER_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    weight: float
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., weight: _Optional[float] = ...) -> None: ...

class SearchExplanation(_message.Message):
    __slots__ = ("strategy", "alpha", "beta", "gamma", "tier_weight", "scope_weight", "base_score", "vector_rank", "keyword_rank", "keyword_score", "combined_score")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    TIER_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BASE_SCORE_FIELD_NUMBER: _ClassVar[int]
    VECTOR_RANK_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_RANK_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_SCORE_FIELD_NUMBER: _ClassVar[int]
    COMBINED_SCORE_FIELD_NUMBER: _ClassVar[int]
    strategy: SearchStrategy
    alpha: float
    beta: float
    gamma: float
    tier_weight: float
    scope_weight: float
    base_score: float
    vector_rank: int
    keyword_rank: int
    keyword_score: float
    combined_score: float
    def __init__(self, strategy: _Optional[_Union[SearchStrategy, str]] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., gamma: _Optional[float] = ..., tier_weight: _Optional[float] = ..., scope_weight: _Optional[float] = ..., base_score: _Optional[float] = ..., vector_rank: _Optional[int] = ..., keyword_rank: _Optional[int] = ..., keyword_score: _Optional[float] = ..., combined_score: _Optional[float] = ...) -> None: ...

class SearchResult(_message.Message):
    __slots__ = ("memory", "score", "relevance", "recency", "importance", "explanation")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    RECENCY_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    score: float
    relevance: float
    recency: float
    importance: float
    explanation: SearchExplanation
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., score: _Optional[float] = ..., relevance: _Optional[float] = ..., recency: _Optional[float] = ..., importance: _Optional[float] = ..., explanation: _Optional[_Union[SearchExplanation, _Mapping]] = ...) -> None: ...

class SearchMemoriesResponse(_message.Message):
    __slots__ = ("results", "keyword_only", "warnings")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_ONLY_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SearchResult]
    keyword_only: bool
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, results: _Optional[_Iterable[_Union[SearchResult, _Mapping]]] = ..., keyword_only: _Optional[bool] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class Feedback(_message.Message):
    __slots__ = ("id", "predicted_relevance", "actual_usefulness", "success")
    ID_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_USEFULNESS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    predicted_relevance: float
    actual_usefulness: float
    success: bool
    def __init__(self, id: _Optional[str] = ..., predicted_relevance: _Optional[float] = ..., actual_usefulness: _Optional[float] = ..., success: _Optional[bool] = ...) -> None: ...

class RecordFeedbackRequest(_message.Message):
    __slots__ = ("namespace", "items", "as_of")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    items: _containers.RepeatedCompositeFieldContainer[Feedback]
    as_of: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., items: _Optional[_Iterable[_Union[Feedback, _Mapping]]] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RecordFeedbackResponse(_message.Message):
    __slots__ = ("memories",)
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "memory_count", "avg_importance", "avg_surprise", "promotions_total", "demotions_total", "evictions_total", "promotions_last_hour", "demotions_last_hour", "evictions_last_hour", "deleted_total")
    TIER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    AVG_IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    AVG_SURPRISE_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DEMOTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    DEMOTIONS_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    DELETED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    memory_count: int
    avg_importance: float
    avg_surprise: float
    promotions_total: int
    demotions_total: int
    evictions_total: int
    promotions_last_hour: int
    demotions_last_hour: int
    evictions_last_hour: int
    deleted_total: int
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., memory_count: _Optional[int] = ..., avg_importance: _Optional[float] = ..., avg_surprise: _Optional[float] = ..., promotions_total: _Optional[int] = ..., demotions_total: _Optional[int] = ..., evictions_total: _Optional[int] = ..., promotions_last_hour: _Optional[int] = ..., demotions_last_hour: _Optional[int] = ..., evictions_last_hour: _Optional[int] = ..., deleted_total: _Optional[int] = ...) -> None: ...

class EmbeddingSpaceStats(_message.Message):
    __slots__ = ("embedding_model", "dimension", "live_vectors", "indexed_vectors", "pending_vectors")
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    LIVE_VECTORS_FIELD_NUMBER: _ClassVar[int]
    INDEXED_VECTORS_FIELD_NUMBER: _ClassVar[int]
    PENDING_VECTORS_FIELD_NUMBER: _ClassVar[int]
    embedding_model: str
    dimension: int
    live_vectors: int
    indexed_vectors: int
    pending_vectors: int
    def __init__(self, embedding_model: _Optional[str] = ..., dimension: _Optional[int] = ..., live_vectors: _Optional[int] = ..., indexed_vectors: _Optional[int] = ..., pending_vectors: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("memory_count", "namespace_count", "tiers", "spaces", "writes_committed", "commit_groups", "uptime_seconds", "storage_bytes", "server_version", "search_hits", "search_misses", "hit_rate", "reflection_importance", "reflection_due", "summary_tokens", "summary_due", "summaries_stored", "summary_tokens_saved", "summary_failures")
    MEMORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    SPACES_FIELD_NUMBER: _ClassVar[int]
    WRITES_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_GROUPS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEARCH_HITS_FIELD_NUMBER: _ClassVar[int]
    SEARCH_MISSES_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    REFLECTION_IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    REFLECTION_DUE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_DUE_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_STORED_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TOKENS_SAVED_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FAILURES_FIELD_NUMBER: _ClassVar[int]
    memory_count: int
    namespace_count: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    spaces: _containers.RepeatedCompositeFieldContainer[EmbeddingSpaceStats]
    writes_committed: int
    commit_groups: int
    uptime_seconds: float
    storage_bytes: int
    server_version: str
    search_hits: int
    search_misses: int
    hit_rate: float
    reflection_importance: float
    reflection_due: bool
    summary_tokens: int
    summary_due: bool
    summaries_stored: int
    summary_tokens_saved: int
    summary_failures: int
    def __init__(self, memory_count: _Optional[int] = ..., namespace_count: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., spaces: _Optional[_Iterable[_Union[EmbeddingSpaceStats, _Mapping]]] = ..., writes_committed: _Optional[int] = ..., commit_groups: _Optional[int] = ..., uptime_seconds: _Optional[float] = ..., storage_bytes: _Optional[int] = ..., server_version: _Optional[str] = ..., search_hits: _Optional[int] = ..., search_misses: _Optional[int] = ..., hit_rate: _Optional[float] = ..., reflection_importance: _Optional[float] = ..., reflection_due: _Optional[bool] = ..., summary_tokens: _Optional[int] = ..., summary_due: _Optional[bool] = ..., summaries_stored: _Optional[int] = ..., summary_tokens_saved: _Optional[int] = ..., summary_failures: _Optional[int] = ...) -> None: ...

class ListNamespacesRequest(_message.Message):
    __slots__ = ("prefix", "page_size", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    page_size: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class NamespaceInfo(_message.Message):
    __slots__ = ("name", "memory_count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    memory_count: int
    def __init__(self, name: _Optional[str] = ..., memory_count: _Optional[int] = ...) -> None: ...

class ListNamespacesResponse(_message.Message):
    __slots__ = ("namespaces", "next_page_token")
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[NamespaceInfo]
    next_page_token: str
    def __init__(self, namespaces: _Optional[_Iterable[_Union[NamespaceInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteNamespaceRequest(_message.Message):
    __slots__ = ("namespace", "include_children", "confirm")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    include_children: bool
    confirm: bool
    def __init__(self, namespace: _Optional[str] = ..., include_children: _Optional[bool] = ..., confirm: _Optional[bool] = ...) -> None: ...

class DeleteNamespaceResponse(_message.Message):
    __slots__ = ("deleted_count",)
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    deleted_count: int
    def __init__(self, deleted_count: _Optional[int] = ...) -> None: ...

class SetScopeRoutingRequest(_message.Message):
    __slots__ = ("scope", "routing", "moved_to", "purge")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    MOVED_TO_FIELD_NUMBER: _ClassVar[int]
    PURGE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    routing: ScopeRouting
    moved_to: str
    purge: bool
    def __init__(self, scope: _Optional[str] = ..., routing: _Optional[_Union[ScopeRouting, str]] = ..., moved_to: _Optional[str] = ..., purge: _Optional[bool] = ...) -> None: ...

class SetScopeRoutingResponse(_message.Message):
    __slots__ = ("routing", "purged_count")
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    PURGED_COUNT_FIELD_NUMBER: _ClassVar[int]
    routing: ScopeRouting
    purged_count: int
    def __init__(self, routing: _Optional[_Union[ScopeRouting, str]] = ..., purged_count: _Optional[int] = ...) -> None: ...

class GetScopeRoutingRequest(_message.Message):
    __slots__ = ("scope",)
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    def __init__(self, scope: _Optional[str] = ...) -> None: ...

class GetScopeRoutingResponse(_message.Message):
    __slots__ = ("routing", "moved_to")
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    MOVED_TO_FIELD_NUMBER: _ClassVar[int]
    routing: ScopeRouting
    moved_to: str
    def __init__(self, routing: _Optional[_Union[ScopeRouting, str]] = ..., moved_to: _Optional[str] = ...) -> None: ...

class ReplicateChangesRequest(_message.Message):
    __slots__ = ("instance_id", "applied_seq")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    applied_seq: int
    def __init__(self, instance_id: _Optional[str] = ..., applied_seq: _Optional[int] = ...) -> None: ...

class ReplicateChangesResponse(_message.Message):
    __slots__ = ("instance_id", "seq", "full_copy_start", "changes")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FULL_COPY_START_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    seq: int
    full_copy_start: bool
    changes: bytes
    def __init__(self, instance_id: _Optional[str] = ..., seq: _Optional[int] = ..., full_copy_start: _Optional[bool] = ..., changes: _Optional[bytes] = ...) -> None: ...

class PromoteReplicaRequest(_message.Message):
    __slots__ = ("leader_instance_id",)
    LEADER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    leader_instance_id: str
    def __init__(self, leader_instance_id: _Optional[str] = ...) -> None: ...

class PromoteReplicaResponse(_message.Message):
    __slots__ = ("leader_instance_id", "applied_seq", "memory_count")
    LEADER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    MEMORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    leader_instance_id: str
    applied_seq: int
    memory_count: int
    def __init__(self, leader_instance_id: _Optional[str] = ..., applied_seq: _Optional[int] = ..., memory_count: _Optional[int] = ...) -> None: ...

class KindCapacity(_message.Message):
    __slots__ = ("kind", "max_items")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    max_items: int
    def __init__(self, kind: _Optional[str] = ..., max_items: _Optional[int] = ...) -> None: ...

class TierPolicy(_message.Message):
    __slots__ = ("tier", "ttl_seconds", "max_items", "importance_threshold", "half_life_hours", "cadence_seconds")
    TIER_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    HALF_LIFE_HOURS_FIELD_NUMBER: _ClassVar[int]
    CADENCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    ttl_seconds: float
    max_items: int
    importance_threshold: float
    half_life_hours: float
    cadence_seconds: float
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., ttl_seconds: _Optional[float] = ..., max_items: _Optional[int] = ..., importance_threshold: _Optional[float] = ..., half_life_hours: _Optional[float] = ..., cadence_seconds: _Optional[float] = ...) -> None: ...

class LifecyclePolicy(_message.Message):
    __slots__ = ("tiers", "retention", "delete_from_glacial", "promote_access_count", "promote_surprise", "promote_success_count", "reflection_threshold", "summary_token_threshold", "default_importance", "importance_decay", "importance_floor", "importance_heuristic", "promote_through_tiers", "decay_grace", "summarize_evictions", "max_items", "kind_capacities", "evict_share", "evict_on_create", "preset", "recency_basis", "auto_summarize", "summary_max_tokens", "summary_strategy", "working_token_limit")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    DELETE_FROM_GLACIAL_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_ACCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_SURPRISE_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_SUCCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    REFLECTION_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TOKEN_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_DECAY_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FLOOR_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_HEURISTIC_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_THROUGH_TIERS_FIELD_NUMBER: _ClassVar[int]
    DECAY_GRACE_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZE_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    KIND_CAPACITIES_FIELD_NUMBER: _ClassVar[int]
    EVICT_SHARE_FIELD_NUMBER: _ClassVar[int]
    EVICT_ON_CREATE_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    RECENCY_BASIS_FIELD_NUMBER: _ClassVar[int]
    AUTO_SUMMARIZE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    WORKING_TOKEN_LIMIT_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierPolicy]
    retention: RetentionPolicy
    delete_from_glacial: bool
    promote_access_count: int
    promote_surprise: float
    promote_success_count: int
    reflection_threshold: float
    summary_token_threshold: int
    default_importance: float
    importance_decay: ImportanceDecay
    importance_floor: float
    importance_heuristic: ImportanceHeuristic
    promote_through_tiers: bool
    decay_grace: bool
    summarize_evictions: bool
    max_items: int
    kind_capacities: _containers.RepeatedCompositeFieldContainer[KindCapacity]
    evict_share: float
    evict_on_create: bool
    preset: str
    recency_basis: RecencyBasis
    auto_summarize: bool
    summary_max_tokens: int
    summary_strategy: SummaryStrategy
    working_token_limit: int
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierPolicy, _Mapping]]] = ..., retention: _Optional[_Union[RetentionPolicy, str]] = ..., delete_from_glacial: _Optional[bool] = ..., promote_access_count: _Optional[int] = ..., promote_surprise: _Optional[float] = ..., promote_success_count: _Optional[int] = ..., reflection_threshold: _Optional[float] = ..., summary_token_threshold: _Optional[int] = ..., default_importance: _Optional[float] = ..., importance_decay: _Optional[_Union[ImportanceDecay, str]] = ..., importance_floor: _Optional[float] = ..., importance_heuristic: _Optional[_Union[ImportanceHeuristic, str]] = ..., promote_through_tiers: _Optional[bool] = ..., decay_grace: _Optional[bool] = ..., summarize_evictions: _Optional[bool] = ..., max_items: _Optional[int] = ..., kind_capacities: _Optional[_Iterable[_Union[KindCapacity, _Mapping]]] = ..., evict_share: _Optional[float] = ..., evict_on_create: _Optional[bool] = ..., preset: _Optional[str] = ..., recency_basis: _Optional[_Union[RecencyBasis, str]] = ..., auto_summarize: _Optional[bool] = ..., summary_max_tokens: _Optional[int] = ..., summary_strategy: _Optional[_Union[SummaryStrategy, str]] = ..., working_token_limit: _Optional[int] = ...) -> None: ...

class NamespaceConfig(_message.Message):
    __slots__ = ("namespace", "protected", "policy")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    protected: bool
    policy: LifecyclePolicy
    def __init__(self, namespace: _Optional[str] = ..., protected: _Optional[bool] = ..., policy: _Optional[_Union[LifecyclePolicy, _Mapping]] = ...) -> None: ...

class GetNamespaceConfigRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class GetNamespaceConfigResponse(_message.Message):
    __slots__ = ("config", "effective")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    config: NamespaceConfig
    effective: LifecyclePolicy
    def __init__(self, config: _Optional[_Union[NamespaceConfig, _Mapping]] = ..., effective: _Optional[_Union[LifecyclePolicy, _Mapping]] = ...) -> None: ...

class UpdateNamespaceConfigRequest(_message.Message):
    __slots__ = ("config", "update_mask", "confirm")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    config: NamespaceConfig
    update_mask: _field_mask_pb2.FieldMask
    confirm: bool
    def __init__(self, config: _Optional[_Union[NamespaceConfig, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., confirm: _Optional[bool] = ...) -> None: ...

class UpdateNamespaceConfigResponse(_message.Message):
    __slots__ = ("config", "effective")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    config: NamespaceConfig
    effective: LifecyclePolicy
    def __init__(self, config: _Optional[_Union[NamespaceConfig, _Mapping]] = ..., effective: _Optional[_Union[LifecyclePolicy, _Mapping]] = ...) -> None: ...

class TierMove(_message.Message):
    __slots__ = ("namespace", "id", "from_tier", "to_tier", "reason")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FROM_TIER_FIELD_NUMBER: _ClassVar[int]
    TO_TIER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    from_tier: Tier
    to_tier: Tier
    reason: MoveReason
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., from_tier: _Optional[_Union[Tier, str]] = ..., to_tier: _Optional[_Union[Tier, str]] = ..., reason: _Optional[_Union[MoveReason, str]] = ...) -> None: ...

class ConsolidateMemoriesRequest(_message.Message):
    __slots__ = ("namespace", "dry_run", "max_reported_moves")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_REPORTED_MOVES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    dry_run: bool
    max_reported_moves: int
    def __init__(self, namespace: _Optional[str] = ..., dry_run: _Optional[bool] = ..., max_reported_moves: _Optional[int] = ...) -> None: ...

class ConsolidateMemoriesResponse(_message.Message):
    __slots__ = ("moves", "promoted", "demoted", "evicted", "deleted", "over_capacity", "skipped", "plan_seconds", "apply_seconds", "max_search_pause_seconds")
    MOVES_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    DEMOTED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    OVER_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    PLAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    APPLY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_SEARCH_PAUSE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[TierMove]
    promoted: int
    demoted: int
    evicted: int
    deleted: int
    over_capacity: int
    skipped: int
    plan_seconds: float
    apply_seconds: float
    max_search_pause_seconds: float
    def __init__(self, moves: _Optional[_Iterable[_Union[TierMove, _Mapping]]] = ..., promoted: _Optional[int] = ..., demoted: _Optional[int] = ..., evicted: _Optional[int] = ..., deleted: _Optional[int] = ..., over_capacity: _Optional[int] = ..., skipped: _Optional[int] = ..., plan_seconds: _Optional[float] = ..., apply_seconds: _Optional[float] = ..., max_search_pause_seconds: _Optional[float] = ...) -> None: ...

class TransferMemoryRequest(_message.Message):
    __slots__ = ("namespace", "id", "target_namespace", "target_tier", "mode", "target_id", "overwrite", "confirm")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TARGET_TIER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    target_namespace: str
    target_tier: Tier
    mode: TransferMode
    target_id: str
    overwrite: bool
    confirm: bool
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., target_namespace: _Optional[str] = ..., target_tier: _Optional[_Union[Tier, str]] = ..., mode: _Optional[_Union[TransferMode, str]] = ..., target_id: _Optional[str] = ..., overwrite: _Optional[bool] = ..., confirm: _Optional[bool] = ...) -> None: ...

class TransferMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ...) -> None: ...

class BatchSearchMemoriesRequest(_message.Message):
    __slots__ = ("searches",)
    SEARCHES_FIELD_NUMBER: _ClassVar[int]
    searches: _containers.RepeatedCompositeFieldContainer[SearchMemoriesRequest]
    def __init__(self, searches: _Optional[_Iterable[_Union[SearchMemoriesRequest, _Mapping]]] = ...) -> None: ...

class BatchSearchMemoriesResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[SearchMemoriesResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[SearchMemoriesResponse, _Mapping]]] = ...) -> None: ...

class ExportMemoriesRequest(_message.Message):
    __slots__ = ("namespace", "include_children")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    include_children: bool
    def __init__(self, namespace: _Optional[str] = ..., include_children: _Optional[bool] = ...) -> None: ...

class ExportHeader(_message.Message):
    __slots__ = ("format_version", "server_version", "export_time", "embedder_model", "namespace")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TIME_FIELD_NUMBER: _ClassVar[int]
    EMBEDDER_MODEL_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    server_version: str
    export_time: _timestamp_pb2.Timestamp
    embedder_model: str
    namespace: str
    def __init__(self, format_version: _Optional[int] = ..., server_version: _Optional[str] = ..., export_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., embedder_model: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class ExportMemoriesResponse(_message.Message):
    __slots__ = ("header", "memory", "node", "edge", "scope", "settings", "graph_namespace")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EDGE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    header: ExportHeader
    memory: Memory
    node: GraphNode
    edge: GraphEdge
    scope: ScopeState
    settings: NamespaceConfig
    graph_namespace: str
    def __init__(self, header: _Optional[_Union[ExportHeader, _Mapping]] = ..., memory: _Optional[_Union[Memory, _Mapping]] = ..., node: _Optional[_Union[GraphNode, _Mapping]] = ..., edge: _Optional[_Union[GraphEdge, _Mapping]] = ..., scope: _Optional[_Union[ScopeState, _Mapping]] = ..., settings: _Optional[_Union[NamespaceConfig, _Mapping]] = ..., graph_namespace: _Optional[str] = ...) -> None: ...

class ScopeState(_message.Message):
    __slots__ = ("namespace", "reflection_importance", "summary_tokens")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REFLECTION_IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    reflection_importance: float
    summary_tokens: int
    def __init__(self, namespace: _Optional[str] = ..., reflection_importance: _Optional[float] = ..., summary_tokens: _Optional[int] = ...) -> None: ...

class ImportMemoriesRequest(_message.Message):
    __slots__ = ("header", "memory", "node", "edge", "scope", "settings", "graph_namespace", "target_namespace", "confirm", "end_marked", "end")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EDGE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TARGET_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    END_MARKED_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    header: ExportHeader
    memory: Memory
    node: GraphNode
    edge: GraphEdge
    scope: ScopeState
    settings: NamespaceConfig
    graph_namespace: str
    target_namespace: str
    confirm: bool
    end_marked: bool
    end: bool
    def __init__(self, header: _Optional[_Union[ExportHeader, _Mapping]] = ..., memory: _Optional[_Union[Memory, _Mapping]] = ..., node: _Optional[_Union[GraphNode, _Mapping]] = ..., edge: _Optional[_Union[GraphEdge, _Mapping]] = ..., scope: _Optional[_Union[ScopeState, _Mapping]] = ..., settings: _Optional[_Union[NamespaceConfig, _Mapping]] = ..., graph_namespace: _Optional[str] = ..., target_namespace: _Optional[str] = ..., confirm: _Optional[bool] = ..., end_marked: _Optional[bool] = ..., end: _Optional[bool] = ...) -> None: ...

class ImportMemoriesResponse(_message.Message):
    __slots__ = ("imported", "graph_items", "reembedded", "settings")
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    GRAPH_ITEMS_FIELD_NUMBER: _ClassVar[int]
    REEMBEDDED_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    imported: int
    graph_items: int
    reembedded: int
    settings: int
    def __init__(self, imported: _Optional[int] = ..., graph_items: _Optional[int] = ..., reembedded: _Optional[int] = ..., settings: _Optional[int] = ...) -> None: ...

class GetReflectionCandidatesRequest(_message.Message):
    __slots__ = ("namespace", "limit")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    limit: int
    def __init__(self, namespace: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class GetReflectionCandidatesResponse(_message.Message):
    __slots__ = ("observations", "accumulated_importance", "threshold", "reflection_due")
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATED_IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    REFLECTION_DUE_FIELD_NUMBER: _ClassVar[int]
    observations: _containers.RepeatedCompositeFieldContainer[Memory]
    accumulated_importance: float
    threshold: float
    reflection_due: bool
    def __init__(self, observations: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., accumulated_importance: _Optional[float] = ..., threshold: _Optional[float] = ..., reflection_due: _Optional[bool] = ...) -> None: ...

class BuildSummaryRequest(_message.Message):
    __slots__ = ("namespace", "max_tokens", "created_after", "created_before")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    max_tokens: int
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., max_tokens: _Optional[int] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BuildSummaryResponse(_message.Message):
    __slots__ = ("text", "source_memory_ids", "token_count")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    text: str
    source_memory_ids: _containers.RepeatedScalarFieldContainer[str]
    token_count: int
    def __init__(self, text: _Optional[str] = ..., source_memory_ids: _Optional[_Iterable[str]] = ..., token_count: _Optional[int] = ...) -> None: ...

class GraphNode(_message.Message):
    __slots__ = ("id", "label", "properties", "memory_ids", "update_time")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    label: str
    properties: _containers.MessageMap[str, Value]
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., label: _Optional[str] = ..., properties: _Optional[_Mapping[str, Value]] = ..., memory_ids: _Optional[_Iterable[str]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GraphEdge(_message.Message):
    __slots__ = ("id", "source_id", "target_id", "relation", "properties", "memory_ids", "valid_from", "invalid_from", "create_time")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    RELATION_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    INVALID_FROM_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    source_id: str
    target_id: str
    relation: str
    properties: _containers.MessageMap[str, Value]
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    valid_from: _timestamp_pb2.Timestamp
    invalid_from: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., source_id: _Optional[str] = ..., target_id: _Optional[str] = ..., relation: _Optional[str] = ..., properties: _Optional[_Mapping[str, Value]] = ..., memory_ids: _Optional[_Iterable[str]] = ..., valid_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., invalid_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UpsertGraphNodeRequest(_message.Message):
    __slots__ = ("namespace", "node")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    node: GraphNode
    def __init__(self, namespace: _Optional[str] = ..., node: _Optional[_Union[GraphNode, _Mapping]] = ...) -> None: ...

class UpsertGraphNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: GraphNode
    def __init__(self, node: _Optional[_Union[GraphNode, _Mapping]] = ...) -> None: ...

class AddGraphEdgeRequest(_message.Message):
    __slots__ = ("namespace", "edge")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    EDGE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    edge: GraphEdge
    def __init__(self, namespace: _Optional[str] = ..., edge: _Optional[_Union[GraphEdge, _Mapping]] = ...) -> None: ...

class AddGraphEdgeResponse(_message.Message):
    __slots__ = ("edge",)
    EDGE_FIELD_NUMBER: _ClassVar[int]
    edge: GraphEdge
    def __init__(self, edge: _Optional[_Union[GraphEdge, _Mapping]] = ...) -> None: ...

class InvalidateGraphEdgeRequest(_message.Message):
    __slots__ = ("namespace", "edge_id", "invalid_from")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    INVALID_FROM_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    edge_id: str
    invalid_from: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., edge_id: _Optional[str] = ..., invalid_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class InvalidateGraphEdgeResponse(_message.Message):
    __slots__ = ("edge",)
    EDGE_FIELD_NUMBER: _ClassVar[int]
    edge: GraphEdge
    def __init__(self, edge: _Optional[_Union[GraphEdge, _Mapping]] = ...) -> None: ...

class GetGraphNeighborsRequest(_message.Message):
    __slots__ = ("namespace", "node_id", "depth", "limit", "as_of", "include_invalid")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INVALID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    node_id: str
    depth: int
    limit: int
    as_of: _timestamp_pb2.Timestamp
    include_invalid: bool
    def __init__(self, namespace: _Optional[str] = ..., node_id: _Optional[str] = ..., depth: _Optional[int] = ..., limit: _Optional[int] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., include_invalid: _Optional[bool] = ...) -> None: ...

class GetGraphNeighborsResponse(_message.Message):
    __slots__ = ("nodes", "edges")
    NODES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[GraphNode]
    edges: _containers.RepeatedCompositeFieldContainer[GraphEdge]
    def __init__(self, nodes: _Optional[_Iterable[_Union[GraphNode, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[GraphEdge, _Mapping]]] = ...) -> None: ...

class ContextScope(_message.Message):
    __slots__ = ("namespace", "share", "semantic_k", "recent_window", "fill")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_K_FIELD_NUMBER: _ClassVar[int]
    RECENT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    share: float
    semantic_k: int
    recent_window: int
    fill: bool
    def __init__(self, namespace: _Optional[str] = ..., share: _Optional[float] = ..., semantic_k: _Optional[int] = ..., recent_window: _Optional[int] = ..., fill: _Optional[bool] = ...) -> None: ...

class BuildContextRequest(_message.Message):
    __slots__ = ("scopes", "query_text", "token_budget", "head_tail", "graph_facts", "read_only", "summarize_overflow")
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    QUERY_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    HEAD_TAIL_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FACTS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZE_OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedCompositeFieldContainer[ContextScope]
    query_text: str
    token_budget: int
    head_tail: int
    graph_facts: bool
    read_only: bool
    summarize_overflow: bool
    def __init__(self, scopes: _Optional[_Iterable[_Union[ContextScope, _Mapping]]] = ..., query_text: _Optional[str] = ..., token_budget: _Optional[int] = ..., head_tail: _Optional[int] = ..., graph_facts: _Optional[bool] = ..., read_only: _Optional[bool] = ..., summarize_overflow: _Optional[bool] = ...) -> None: ...

class ContextItem(_message.Message):
    __slots__ = ("memory_id", "text", "tokens")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    text: str
    tokens: int
    def __init__(self, memory_id: _Optional[str] = ..., text: _Optional[str] = ..., tokens: _Optional[int] = ...) -> None: ...

class ContextSection(_message.Message):
    __slots__ = ("namespace", "kind", "items", "tokens")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kind: str
    items: _containers.RepeatedCompositeFieldContainer[ContextItem]
    tokens: int
    def __init__(self, namespace: _Optional[str] = ..., kind: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ContextItem, _Mapping]]] = ..., tokens: _Optional[int] = ...) -> None: ...

class BuildContextResponse(_message.Message):
    __slots__ = ("sections", "tokens_used", "candidate_tokens", "compression_ratio", "warnings")
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_RATIO_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    sections: _containers.RepeatedCompositeFieldContainer[ContextSection]
    tokens_used: int
    candidate_tokens: int
    compression_ratio: float
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sections: _Optional[_Iterable[_Union[ContextSection, _Mapping]]] = ..., tokens_used: _Optional[int] = ..., candidate_tokens: _Optional[int] = ..., compression_ratio: _Optional[float] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...
