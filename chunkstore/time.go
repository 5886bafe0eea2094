package chunkstore

import "time"

func timeFromNanos(ns int64) time.Time { return time.Unix(0, ns) }
