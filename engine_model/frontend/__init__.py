"""The API-server frontend: AsyncLLM, OutputProcessor and the output collectors."""

from racesim.engine_model.frontend.async_llm import AsyncLLM
from racesim.engine_model.frontend.output_processor import (
    AlreadyRunning,
    OutputProcessor,
    ParentRequest,
    RequestState,
)
from racesim.engine_model.frontend.outputs import (
    CompletionOutput,
    RequestOutput,
    RequestOutputCollector,
)

__all__ = ["AlreadyRunning", "AsyncLLM", "CompletionOutput", "OutputProcessor", "ParentRequest",
           "RequestOutput", "RequestOutputCollector", "RequestState"]
