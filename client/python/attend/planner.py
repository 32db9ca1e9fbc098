"""Calls of attend.v1.Planner: model presets, config imports, KV-cache capacity plans and cost
estimates. Thin wrappers: they return the response messages (attend.v1.planner_pb2) as they
come, and name no sequence (no routing key).
"""
from .v1 import planner_pb2

__all__ = ["PlannerMixin", "model_ref"]

_SERVICE = "/attend.v1.Planner/"


def model_ref(model):
    """A ModelRef from a catalog name (str), a ModelSpec or a ModelRef."""
    if isinstance(model, planner_pb2.ModelRef):
        return model
    if isinstance(model, planner_pb2.ModelSpec):
        return planner_pb2.ModelRef(spec=model)
    return planner_pb2.ModelRef(name=str(model))


def _kv_dtype(value):
    """A KvDType from its number or a name: "float16", "fp8", "q8_0", "KV_Q8_0", ..."""
    if value is None or isinstance(value, int):
        return value or 0
    name = str(value).upper()
    if not name.startswith("KV_"):
        name = "KV_" + name
    return planner_pb2.KvDType.Value(name)


def _request(request_class, request, fields):
    """`request` as is, or a request_class made from `fields` (model: a name, ModelSpec or
    ModelRef; kv_dtype, state_dtype and indexer_dtype: a KvDType or its name)."""
    if request is not None:
        if fields:
            raise TypeError("give a request or its fields, not both")
        return request
    if "model" in fields:
        fields["model"] = model_ref(fields["model"])
    for name in ("kv_dtype", "state_dtype", "indexer_dtype"):
        if name in fields:
            fields[name] = _kv_dtype(fields[name])
    return request_class(**fields)


class PlannerMixin:
    """The Planner calls of attend.Client (which provides `_connection`)."""

    def _planner_call(self, name, request, response_class):
        return self._connection.call(self._connection.method(
            _SERVICE + name, response_class, type(request)), request)

    def list_models(self):
        """The catalog's ModelSpecs (a list)."""
        return list(self._planner_call("ListModels", planner_pb2.ListModelsRequest(),
                                       planner_pb2.ListModelsResponse).models)

    def get_model(self, name):
        """The catalog's ModelSpec called `name` (e.g. "llama-3-8b"); NotFound otherwise."""
        return self._planner_call("GetModel", planner_pb2.GetModelRequest(name=name),
                                  planner_pb2.ModelSpec)

    def import_model(self, *, hf_config_json=None, gguf=None, name=""):
        """A ModelSpec read from a Hugging Face config.json text (str) or the start of a GGUF
        file (bytes: the header and metadata), named `name` (default: from the input)."""
        if (hf_config_json is None) == (gguf is None):
            raise TypeError("give exactly one of hf_config_json and gguf")
        request = planner_pb2.ImportModelRequest(name=name)
        if hf_config_json is not None:
            request.hf_config_json = hf_config_json
        else:
            request.gguf = bytes(gguf)
        return self._planner_call("ImportModel", request, planner_pb2.ModelSpec)

    def plan_kv_cache(self, request=None, **fields):
        """A PlanKvCacheResponse for a PlanKvCacheRequest, or for its fields as keywords, e.g.
        plan_kv_cache(model="llama-3-70b", kv_dtype="fp8", context_tokens=32768, batch=16,
        memory_budget_bytes=80 << 30)."""
        return self._planner_call("PlanKvCache", _request(planner_pb2.PlanKvCacheRequest,
                                                          request, fields),
                                  planner_pb2.PlanKvCacheResponse)

    def estimate_cost(self, request=None, **fields):
        """An EstimateCostResponse for an EstimateCostRequest, or for its fields as keywords,
        e.g. estimate_cost(model="llama-3-8b", prompt_tokens=4096, profile="h100")."""
        return self._planner_call("EstimateCost", _request(planner_pb2.EstimateCostRequest,
                                                           request, fields),
                                  planner_pb2.EstimateCostResponse)
