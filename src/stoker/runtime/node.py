"""`python -m stoker.runtime.node --store URL --code KEY --spec KEY`: the command a node of any engine may run
(the contract's `Unit.command`), kept at this path for images and job definitions; the node agent is
runtime/member/node.py."""

from __future__ import annotations

from stoker.runtime.member.node import main

if __name__ == "__main__":
    main()
