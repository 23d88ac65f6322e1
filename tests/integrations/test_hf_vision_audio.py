"""Hugging Face vision and speech models train on axon as on the CPU: a
training step of tiny random-init models with BatchNorm (ResNet, MobileNetV2),
LayerNorm and depthwise convolutions (ConvNeXt, SegFormer's segmentation head)
and Wav2Vec2 with a CTC loss (weight-normed positional convolution): the same
loss as the CPU, gradients as close to a float64 run as the CPU's, and nothing
in the synchronous fallback. Stochastic parts (dropout, drop-path, SpecAugment
masks) are off: axon draws other random numbers than the CPU."""

import copy

import pytest
import torch

from conftest import assert_same


def image_batch():
    g = torch.Generator().manual_seed(1)
    return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=g), labels=torch.tensor([0, 2]))


def cases():
    import transformers as T

    return {
        "resnet": (lambda: T.ResNetForImageClassification(T.ResNetConfig(
            num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
            num_labels=3)), image_batch),
        "mobilenet_v2": (lambda: T.MobileNetV2ForImageClassification(T.MobileNetV2Config(
            num_channels=3, image_size=32, depth_multiplier=0.25, num_labels=3)), image_batch),
        "convnext": (lambda: T.ConvNextForImageClassification(T.ConvNextConfig(
            num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3)),
            image_batch),
        "segformer": (lambda: T.SegformerForSemanticSegmentation(T.SegformerConfig(
            num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
            hidden_sizes=[8, 16], num_attention_heads=[1, 2], decoder_hidden_size=16,
            num_labels=3, drop_path_rate=0.0)), lambda: dict(image_batch(), labels=torch.randint(
                0, 3, (2, 32, 32), generator=torch.Generator().manual_seed(2)))),
        "wav2vec2_ctc": (lambda: T.Wav2Vec2ForCTC(T.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
            conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2, vocab_size=12, do_stable_layer_norm=True,
            mask_time_prob=0.0, layerdrop=0.0)),  # no random SpecAugment masks
            lambda: dict(input_values=torch.randn(2, 800, generator=torch.Generator().manual_seed(3)),
                         labels=torch.tensor([[1, 2, 3, 4], [5, 6, 7, -100]]))),
    }


@pytest.mark.parametrize("name", ["resnet", "mobilenet_v2", "convnext", "segformer",
                                  "wav2vec2_ctc"])
def test_training_step_matches_cpu(name):
    make_model, make_batch = cases()[name]
    torch.manual_seed(0)
    cpu = make_model().train()
    for m in cpu.modules():  # dropout is random: off on both (and drop-path rates 0)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    ax = copy.deepcopy(cpu).to("axon")
    f64 = copy.deepcopy(cpu).double()
    batch = make_batch()
    torch.axon.reset_fallback_stats()
    loss_c = cpu(**batch).loss
    loss_c.backward()
    loss_a = ax(**{k: v.axon() for k, v in batch.items()}).loss
    loss_a.backward()
    f64(**{k: v.double() if v.is_floating_point() else v for k, v in batch.items()}).loss.backward()
    assert_same(loss_a, loss_c.detach(), rtol=1e-5, atol=1e-5)
    # Gradients: as close to a float64 run as the CPU's, within 4x (the CPU sums
    # float32 reductions in float64, axon in float32 as CUDA does); a fixed
    # tolerance would not do: a bias before a normalisation, or a key bias
    # before softmax, has a gradient that is zero up to rounding.
    for (pname, pc), pa, pd in zip(cpu.named_parameters(), ax.parameters(), f64.parameters()):
        assert (pa.grad is None) == (pc.grad is None), pname
        if pc.grad is None:
            continue
        err_c = (pc.grad.double() - pd.grad).abs().max().item()
        err_a = (pa.grad.cpu().double() - pd.grad).abs().max().item()
        assert err_a <= 4 * err_c + 1e-6 * pd.grad.abs().max().item() + 1e-12, \
            f"{pname}: axon {err_a:.2e} from float64, the CPU {err_c:.2e}"
    # Running statistics of the BatchNorm models moved the same way.
    for (bname, bc), ba in zip(cpu.named_buffers(), ax.buffers()):
        assert_same(ba, bc, rtol=1e-5, atol=1e-6), bname
    assert torch.axon.fallback_stats() == {}
