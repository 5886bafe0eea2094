package main

import (
	"fmt"
	"syscall"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/cuda"
)

// gpuHeld is one device context the node holds for FILL.
type gpuHeld struct {
	Device    int   `json:"device"`
	HeldBytes int64 `json:"held_bytes"`
	Fills     int64 `json:"fills"`
}

// fillService runs FILL requests: one gpuio loader per device.
type fillService struct{}

func (fs *fillService) held() []gpuHeld { return nil }

func (c *clientServer) opFill(sf *chunkstore.File, body []byte, p peer) reply {
	req, err := clientproto.ParseFill(body)
	if err != nil {
		return refuse(err)
	}
	_ = req
	if err := cuda.Available(); err != nil {
		return refuse(fmt.Errorf("no GPU fill on this node: %v: %w", err, syscall.ENODEV))
	}
	return refuse(fmt.Errorf("GPU fill is not implemented in this build: %w", syscall.ENOSYS))
}
