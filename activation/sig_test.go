package activation

import "encoding/base64"

func encodeSig(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func decodeSig(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }
