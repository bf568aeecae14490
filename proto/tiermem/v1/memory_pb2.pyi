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
TIER_UNSPECIFIED: Tier
TIER_FAST: Tier
TIER_MEDIUM: Tier
TIER_SLOW: Tier
TIER_GLACIAL: Tier

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
    __slots__ = ("id", "namespace", "content", "kind", "tier", "importance", "source", "topic", "tags", "metadata", "embedding", "embedding_model", "create_time", "update_time", "last_access_time", "access_count", "surprise_score", "success_count", "token_cost", "source_memory_ids", "expire_time")
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
    def __init__(self, id: _Optional[str] = ..., namespace: _Optional[str] = ..., content: _Optional[str] = ..., kind: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., importance: _Optional[float] = ..., source: _Optional[str] = ..., topic: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Mapping[str, Value]] = ..., embedding: _Optional[_Iterable[float]] = ..., embedding_model: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_access_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., access_count: _Optional[int] = ..., surprise_score: _Optional[float] = ..., success_count: _Optional[int] = ..., token_cost: _Optional[int] = ..., source_memory_ids: _Optional[_Iterable[str]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateMemoryRequest(_message.Message):
    __slots__ = ("memory", "request_id")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    request_id: str
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ...) -> None: ...

class BatchCreateMemoriesRequest(_message.Message):
    __slots__ = ("memories", "request_id")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    request_id: str
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class BatchCreateMemoriesResponse(_message.Message):
    __slots__ = ("memories",)
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("memory", "update_mask")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ...) -> None: ...

class DeleteMemoryRequest(_message.Message):
    __slots__ = ("namespace", "id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class DeleteMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemoryFilter(_message.Message):
    __slots__ = ("tiers", "kinds", "tags_any", "tags_all", "source", "topic", "created_after", "created_before")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    TAGS_ANY_FIELD_NUMBER: _ClassVar[int]
    TAGS_ALL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedScalarFieldContainer[Tier]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    tags_any: _containers.RepeatedScalarFieldContainer[str]
    tags_all: _containers.RepeatedScalarFieldContainer[str]
    source: str
    topic: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    def __init__(self, tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., kinds: _Optional[_Iterable[str]] = ..., tags_any: _Optional[_Iterable[str]] = ..., tags_all: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ..., topic: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListMemoriesRequest(_message.Message):
    __slots__ = ("namespace", "page_size", "page_token", "filter", "include_embedding")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    filter: MemoryFilter
    include_embedding: bool
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[_Union[MemoryFilter, _Mapping]] = ..., include_embedding: _Optional[bool] = ...) -> None: ...

class ListMemoriesResponse(_message.Message):
    __slots__ = ("memories", "next_page_token")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    next_page_token: str
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SearchMemoriesRequest(_message.Message):
    __slots__ = ("namespaces", "query_embedding", "embedding_model", "query_text", "filter", "limit", "min_similarity", "alpha", "beta", "gamma", "recency_tau_seconds", "as_of", "include_embedding")
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
    def __init__(self, namespaces: _Optional[_Iterable[str]] = ..., query_embedding: _Optional[_Iterable[float]] = ..., embedding_model: _Optional[str] = ..., query_text: _Optional[str] = ..., filter: _Optional[_Union[MemoryFilter, _Mapping]] = ..., limit: _Optional[int] = ..., min_similarity: _Optional[float] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., gamma: _Optional[float] = ..., recency_tau_seconds: _Optional[float] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., include_embedding: _Optional[bool] = ...) -> None: ...

class SearchResult(_message.Message):
    __slots__ = ("memory", "score", "relevance", "recency", "importance")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    RECENCY_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    score: float
    relevance: float
    recency: float
    importance: float
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., score: _Optional[float] = ..., relevance: _Optional[float] = ..., recency: _Optional[float] = ..., importance: _Optional[float] = ...) -> None: ...

class SearchMemoriesResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SearchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SearchResult, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("tier", "memory_count", "avg_importance", "avg_surprise")
    TIER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    AVG_IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    AVG_SURPRISE_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    memory_count: int
    avg_importance: float
    avg_surprise: float
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., memory_count: _Optional[int] = ..., avg_importance: _Optional[float] = ..., avg_surprise: _Optional[float] = ...) -> None: ...

class EmbeddingSpaceStats(_message.Message):
    __slots__ = ("embedding_model", "dimension", "live_vectors", "indexed_vectors")
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    LIVE_VECTORS_FIELD_NUMBER: _ClassVar[int]
    INDEXED_VECTORS_FIELD_NUMBER: _ClassVar[int]
    embedding_model: str
    dimension: int
    live_vectors: int
    indexed_vectors: int
    def __init__(self, embedding_model: _Optional[str] = ..., dimension: _Optional[int] = ..., live_vectors: _Optional[int] = ..., indexed_vectors: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("memory_count", "namespace_count", "tiers", "spaces", "writes_committed", "commit_groups", "uptime_seconds", "storage_bytes", "server_version")
    MEMORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    SPACES_FIELD_NUMBER: _ClassVar[int]
    WRITES_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_GROUPS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    memory_count: int
    namespace_count: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    spaces: _containers.RepeatedCompositeFieldContainer[EmbeddingSpaceStats]
    writes_committed: int
    commit_groups: int
    uptime_seconds: float
    storage_bytes: int
    server_version: str
    def __init__(self, memory_count: _Optional[int] = ..., namespace_count: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., spaces: _Optional[_Iterable[_Union[EmbeddingSpaceStats, _Mapping]]] = ..., writes_committed: _Optional[int] = ..., commit_groups: _Optional[int] = ..., uptime_seconds: _Optional[float] = ..., storage_bytes: _Optional[int] = ..., server_version: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class DeleteNamespaceResponse(_message.Message):
    __slots__ = ("deleted_count",)
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    deleted_count: int
    def __init__(self, deleted_count: _Optional[int] = ...) -> None: ...
