"""Evaluate VA placement models on the real runs' segment allocs/frees.

full: the model places every segment itself (only the first segment's address is given);
      a segment is exact when its predicted address minus the first predicted address equals
      the real one minus the first real one; pairs: of all pairs of segments that were live at
      the same time, the fraction whose predicted address order matches the real order.
step: teacher forcing: the model sees every earlier real address and predicts the next one.
"""
import sys, itertools
from collections import defaultdict
from parse import *
import model

def evaluate(run, mk):
    ev=load(run)
    allocs=[e for e in ev if e[0]=='alloc']
    if not allocs: return None
    # full simulation
    m=mk(); real2pred={}; preds=[]; first=None
    live_pairs=0; good_pairs=0; exact=0; n=0
    live=[]  # (real,pred)
    for k,a,b,s,p in ev:
        if k=='alloc':
            if first is None:
                pa=a; first=(a,a)
            else:
                pa=m.predict(b)
            m.place(pa,b)
            real2pred[a]=pa
            n+=1
            if pa-first[1]==a-first[0]: exact+=1
            for ra,pp in live:
                live_pairs+=1
                if (ra<a)==(pp<pa): good_pairs+=1
            live.append((a,pa))
        else:
            pa=real2pred.pop(a)
            m.free(pa,b)
            live.remove((a,pa))
    # teacher forcing
    m=mk(); sexact=0; first=True
    for k,a,b,s,p in ev:
        if k=='alloc':
            if not first and m.predict(b)==a: sexact+=1
            first=False
            m.place(a,b)
        else: m.free(a,b)
    return dict(n=n, exact=exact, pairs=live_pairs, good=good_pairs, sexact=sexact)

# workloads the rule was designed on (looked at in detail); the others are held out
DESIGN={'mixed_sizes','mixed_gc','amp_adamw','varlen_train','two_streams'}
MODELS={'firstfit_up':model.FirstFitUp, 'rust_impl':model.RustImpl, 'bumpdown':model.BumpDown, 'topdown32':model.TopDown,
 'td_best':lambda: model.TopDown(fit='best'),'td_best_high':lambda: model.TopDown(fit='best_high'),'td_highest':lambda: model.TopDown(fit='highest'),
 'chunked':model.Chunked, 'chunked_best':lambda: model.Chunked(sub='best'), 'chunked_newest':lambda: model.Chunked(sub='newest'),
 'chunked_norelease':lambda: model.Chunked(release=False), 'chunked_noblock':lambda: model.Chunked(block_gaps=False), 'chunked_small2':lambda: model.Chunked(small_gran=2*model.M)}
if __name__=='__main__':
    names=sys.argv[1:] or list(MODELS)
    rs=runs()
    for name in names:
        agg=defaultdict(lambda: defaultdict(int))
        for r in rs:
            res=evaluate(r, MODELS[name])
            if res is None: continue
            w=r.split('.')[0]
            for kk,v in res.items(): agg[w][kk]+=v; agg['ALL'][kk]+=v
            agg[w]['runs']+=1; agg['ALL']['runs']+=1
            sp='DESIGN' if w in DESIGN else 'HELDOUT'
            for kk,v in res.items(): agg[sp][kk]+=v
            agg[sp]['runs']+=1
        print(f'== {name}')
        print(f"{'workload':18} runs  segs  exact%  step-exact%  pair-order%")
        for w in sorted(agg, key=lambda x:(x in('ALL','DESIGN','HELDOUT'),x)):
            d=agg[w]
            print(f"{w:18} {d['runs']:4} {d['n']:5} {100*d['exact']/d['n']:7.1f} {100*d['sexact']/max(1,d['n']-d['runs']):11.1f} {100*d['good']/max(1,d['pairs']):11.1f}")
