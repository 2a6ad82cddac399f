import torch, time
def t(f, n=10):
    f(); torch.cuda.synchronize()
    s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    ts=[]
    for _ in range(n):
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts)//2]
for n in (4096, 8192):
    a=torch.randint(-127,128,(n,n),dtype=torch.int8,device='cuda'); b=torch.randint(-127,128,(n,n),dtype=torch.int8,device='cuda')
    bt=b.t().contiguous().t()
    ms=t(lambda: torch._int_mm(a,bt)); print(f"int_mm {n}: {ms:.3f} ms {2*n**3/ms/1e9:.0f} TOPS")
    # stacked slices along M: 3 slices of A at once
    a3=torch.randint(-127,128,(3*n,n),dtype=torch.int8,device='cuda')
    ms=t(lambda: torch._int_mm(a3,bt)); print(f"int_mm 3n x n x n {n}: {ms:.3f} ms {2*3*n**3/ms/1e9:.0f} TOPS")
    x=torch.randn(n,n,device='cuda',dtype=torch.bfloat16); y=torch.randn(n,n,device='cuda',dtype=torch.bfloat16)
    ms=t(lambda: x@y); print(f"bf16 {n}: {ms:.3f} ms {2*n**3/ms/1e9:.0f} TFLOPS")
    xf=x.float(); yf=y.float()
    torch.backends.cuda.matmul.allow_tf32=False
    ms=t(lambda: xf@yf); print(f"f32 {n}: {ms:.3f} ms {2*n**3/ms/1e9:.0f} TFLOPS")
    xd=xf.double(); yd=yf.double()
    ms=t(lambda: xd@yd); print(f"f64 {n}: {ms:.3f} ms {2*n**3/ms/1e9:.0f} TFLOPS")
# exponent spread statistics for randn bf16: fraction of elements with e < rowmax_e - s
x=torch.randn(8192,8192,device='cuda').bfloat16().float()
e=torch.frexp(x)[1]; emax=e.max(dim=1,keepdim=True).values
for s in (4,6,7,13,14,20):
    print("spread>",s, (e < emax - s).float().mean().item())
