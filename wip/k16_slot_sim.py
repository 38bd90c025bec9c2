#!/usr/bin/env python3
"""Host simulation of consume_item_k16's activation-slot accounting (wip/prefill-k16-pipeline.patch).

For every ring lag (A_SETS / 4 = 1, 2), slot size (B_KSTEPS = 1, 2, 4), loop pass (one or three
weight stages) and item length (1..119 K-steps), it replays the kernel's index arithmetic and checks
that each slot of the item is given back exactly once, never before the wgmmas of its last K-step
are complete (after a wgmma.wait_group A_SETS - 1, all but the A_SETS - 1 newest k16 wgmmas are),
and that the ring ends on the slot after the item's last. Run: python3 wip/k16_slot_sim.py
"""
def run(LAG,BK,AK,LOOP,ksteps):
    issued=0; rel=[]; cur=0  # cur: logical slot index of the current slot
    complete=lambda: issued-(4*LAG-1)
    for ks0 in range(0,ksteps,LOOP):
        for u in range(0,LOOP,AK):
            ks=ks0+u
            if ks>=ksteps: break
            for j in range(AK):
                g=ks+j; sub=j%BK
                if g<ksteps:
                    assert cur==g//BK and sub==g%BK
                    issued+=4
                    if ((j-LAG)%BK+BK)%BK==BK-1 and g>=LAG:
                        back=(LAG-sub+BK-1)//BK
                        x=g-LAG; s=cur-back
                        assert s==x//BK and x%BK==BK-1, (LAG,BK,g)
                        assert complete()>=4*x+4
                        rel.append(s)
                    if sub==BK-1: cur+=1
    if ksteps%BK: cur+=1
    used=(ksteps+BK-1)//BK
    held=used-len(rel)
    assert cur==used
    for h in range(held,0,-1): rel.append(cur-h)
    assert sorted(rel)==list(range(used)) and len(set(rel))==used,(LAG,BK,ksteps,rel)
for LAG in (1,2):
    for BK,AK,LOOP in ((1,4,4),(2,4,12),(4,4,12),(1,4,12),(2,4,4)):
        for ksteps in range(1,120): run(LAG,BK,AK,LOOP,ksteps)
print("ok")
