"""Models of the CUDA driver's VA placement for cuMemAlloc, evaluated on dumps."""
import bisect
M=1<<20
G=32*M
def r32(x): return -(-x//G)*G

class TopDown:
    """Chunks reserved top-down; segments go to the lowest free hole inside the chunks."""
    def __init__(self, gran=G, small_gran=None, fit='lowest'):
        self.fit=fit
        self.chunks=[]   # sorted list of (start,end), merged
        self.live={}     # addr->bytes
        self.gran=gran; self.small_gran=small_gran
    def _holes(self):
        segs=sorted(self.live.items())
        for cs,ce in self.chunks:
            cur=cs
            i=bisect.bisect_left(segs,(cs,-1))
            # include a segment starting before cs that overlaps
            if i>0 and segs[i-1][0]+segs[i-1][1]>cs: cur=max(cur,segs[i-1][0]+segs[i-1][1])
            while i<len(segs) and segs[i][0]<ce:
                a,b=segs[i]
                if a>cur: yield cur,a
                cur=max(cur,a+b); i+=1
            if cur<ce: yield cur,ce
    def add_chunk(self,s,e):
        ch=self.chunks+[(s,e)]; ch.sort(); out=[]
        for a,b in ch:
            if out and a<=out[-1][1]: out[-1]=(out[-1][0],max(out[-1][1],b))
            else: out.append((a,b))
        self.chunks=out
    def predict(self,b):
        hs=[h for h in self._holes() if h[1]-h[0]>=b]
        if hs:
            if self.fit=='lowest': return hs[0][0]
            if self.fit=='best': return min(hs,key=lambda h:(h[1]-h[0],h[0]))[0]
            if self.fit=='best_high': return min(hs,key=lambda h:(h[1]-h[0],-h[0]))[0]
            if self.fit=='highest': return hs[-1][0]
        low=self.chunks[0][0]
        g=self.gran if (self.small_gran is None or b>2*M) else self.small_gran
        return low-(-(-b//g)*g)
    def place(self,a,b):
        """Record the actual placement (teacher forcing or own prediction)."""
        s=a//G*G; e=r32(a+b)
        if not any(cs<=a and a+b<=ce for cs,ce in self.chunks):
            self.add_chunk(s,e)
        self.live[a]=b
    def free(self,a,b):
        self.live.pop(a,None)

class FirstFitUp:
    """The current SimDevice fallback: first fit upward from a base, 2 MiB aligned."""
    def __init__(self): self.live={}
    def predict(self,b):
        cur=0
        for a,bb in sorted(self.live.items()):
            if a>=cur+b: break
            cur=max(cur,a+bb)
        return cur
    def place(self,a,b): self.live[a]=b
    def free(self,a,b): self.live.pop(a,None)

class Chunked:
    """Driver VA model: each cuMemAlloc that does not fit in the free space of an existing
    chunk reserves a new chunk of round_up(S, 32 MiB) at the top of the highest free VA
    range that holds it (top-down first fit) and sits at the chunk's bottom; later
    allocations fill chunks' free space bottom-up (the lowest-address hole that fits,
    chunks in address order); a chunk whose segments are all freed goes back to the free VA.
    Only VA below the first chunk's top is known to be free."""
    def __init__(self, gran=G, sub='lowest', release=True, small_gran=None, block_gaps=True):
        self.block_gaps=block_gaps
        self.ch={}     # start -> [end, {addr:bytes}]
        self.top=None
        self.gran=gran; self.sub=sub; self.release=release; self.small_gran=small_gran
        self.seg2ch={}
        self.blocked={}  # start->end: VA known to be taken by something untraced
    def rnd(self,b):
        g=self.gran if (self.small_gran is None or b>2*M) else self.small_gran
        return -(-b//g)*g
    def _holes_in(self,s):
        e,segs=self.ch[s]; cur=s
        for a in sorted(segs):
            if a>cur: yield cur,a
            cur=max(cur,a+segs[a])
        if cur<e: yield cur,e
    def predict(self,b):
        cands=[]
        for s in sorted(self.ch):
            for hs,he in self._holes_in(s):
                if he-hs>=b:
                    if self.sub=='lowest': return hs
                    cands.append((hs,he))
        if cands:
            if self.sub=='best': return min(cands,key=lambda h:(h[1]-h[0],h[0]))[0]
            if self.sub=='newest': return cands[-1][0]
        R=self.rnd(b)
        # free VA ranges below top, from the top down
        cur=self.top
        occ=sorted([(s,v[0]) for s,v in self.ch.items()]+list(self.blocked.items()), reverse=True)
        for s,e in occ:
            if e>cur: cur=min(cur,s); continue
            if cur-e>=R: return cur-R
            cur=s
        return cur-R
    def place(self,a,b):
        for s,(e,segs) in self.ch.items():
            if s<=a<e:
                segs[a]=b; self.seg2ch[a]=s
                if a+b>e: self.ch[s][0]=a+b
                return
        e=a+self.rnd(b)
        nxt=[s for s in list(self.ch)+list(self.blocked) if s>a]
        if nxt: e=min(e,min(nxt))
        e=max(e,a+b)
        self.ch[a]=[e,{a:b}]; self.seg2ch[a]=a
        if self.top is None: self.top=e
        elif e>self.top: self.top=e
        elif nxt and min(nxt)>e and self.block_gaps:
            self.blocked[e]=min(nxt)
    def free(self,a,b):
        s=self.seg2ch.pop(a,None)
        if s is None: return
        segs=self.ch[s][1]; segs.pop(a,None)
        if not segs and self.release: del self.ch[s]

class BumpDown:
    """Trivial reference: every segment directly below all earlier ones, no reuse."""
    def __init__(self): self.low=None
    def predict(self,b): return self.low-b
    def place(self,a,b): self.low=a if self.low is None else min(self.low,a)
    def free(self,a,b): pass

class RustImpl:
    """A top-down SimDevice tried in Rust (not adopted): every segment's range rounded out to 32 MiB is its
    chunk; a new segment takes the top round_up(S, 32 MiB) of the highest gap between chunks
    below the top (the first segment's chunk top), else goes below the lowest. No tail filling."""
    def __init__(self): self.live={}; self.top=None
    def predict(self,b):
        r=-(-b//G)*G; cur=self.top
        for a in sorted(self.live, reverse=True):
            if a>=self.top: continue
            e=-(-(a+self.live[a])//G)*G
            if e<cur and cur-e>=r: return cur-r
            cur=min(cur,a//G*G)
        return cur-r
    def place(self,a,b):
        if self.top is None: self.top=a//G*G
        self.live[a]=b
    def free(self,a,b): self.live.pop(a,None)
