"""``tensorrtserver.api.model_config_pb2``: the data-type and format constants old code compared against.

The legacy package shipped the model-configuration protobuf module; code such as
``input.data_type != model_config.TYPE_FP32`` or ``input.format == model_config.ModelInput.FORMAT_NHWC``
keeps working with the plain objects ``ServerStatusContext`` returns.
"""

from pytriton.client.legacy import DataType, ModelConfig, ModelInput, ModelOutput

globals().update({member.name: member for member in DataType})

__all__ = ["DataType", "ModelConfig", "ModelInput", "ModelOutput", *(member.name for member in DataType)]
