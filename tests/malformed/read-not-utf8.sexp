; expect: E-READ-006 at 3:25
; message: not UTF-8
(defrun tiny :model "café")
