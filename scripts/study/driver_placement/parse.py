import re, os, glob
D=os.environ.get('DUMPS', os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dumps'))
def load(name):
    ev=[]
    for line in open(os.path.join(D,name+'.txt')):
        if line.startswith('#'): continue
        p=line.split()
        kind=p[2]
        kv=dict(x.split('=',1) for x in p[3:] if '=' in x)
        if kind in('segment_alloc','segment_free'):
            ev.append((kind[8:], int(kv['addr'],16), int(kv['bytes']), kv.get('stream'), kv.get('pool')))
    return ev
def runs():
    return sorted(os.path.basename(f)[:-4] for f in glob.glob(D+'/*.txt'))
