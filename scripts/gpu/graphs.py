"""CUDA graphs: torch.compile(mode="reduce-overhead") on a small MLP, and a torch.cuda.graph
capture replayed with new inputs. Prints the results, to compare with a native run."""
import torch

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).cuda()
x = torch.randn(64, 256, device="cuda")
f = torch.compile(m, mode="reduce-overhead")
with torch.no_grad():
    compiled = [round(f(x * (i + 1)).sum().item(), 4) for i in range(6)]
    sx = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            y = m(sx)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = m(sx)
    replays = []
    for i in range(4):
        sx.copy_(torch.full_like(sx, 0.1 * (i + 1)))
        g.replay()
        replays.append(round(y.sum().item(), 4))
print("compiled", compiled)
print("graph", replays)
