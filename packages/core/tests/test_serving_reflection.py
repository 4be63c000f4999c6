"""The reflection pool holds public names and leaves the default pool alone."""

from __future__ import annotations

from google.protobuf import descriptor_pool

from reactantserver.core.serving import public_descriptor_pool


def test_inference_service_is_public_with_public_message_types() -> None:
    pool = public_descriptor_pool()
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    infer = service.methods_by_name["ModelInfer"]
    assert infer.input_type.full_name == "inference.ModelInferRequest"
    assert infer.output_type.full_name == "inference.ModelInferResponse"
    config = pool.FindMessageTypeByName("inference.ModelConfigResponse")
    nested = config.fields_by_name["config"].message_type
    assert nested is not None
    assert nested.full_name == "inference.ModelConfig"


def test_control_health_and_reflection_services_are_in_the_pool() -> None:
    pool = public_descriptor_pool()
    for name in (
        "reactantserver.control.v1.WorkerControl",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ):
        assert pool.FindServiceByName(name).full_name == name


def test_the_default_pool_never_gets_the_public_inference_names() -> None:
    public_descriptor_pool()
    try:
        descriptor_pool.Default().FindMessageTypeByName("inference.ModelInferRequest")
    except KeyError:
        return
    # tritonclient registers its own inference.* files; then they must be its, not ours.
    found = descriptor_pool.Default().FindMessageTypeByName("inference.ModelInferRequest")
    assert not found.file.name.startswith("reactantserver")
